// Package modset knows the modules of this repository and what releasing
// them together takes: one version in every sibling requirement, and each
// public module packed as a module proxy would serve it.
//
// It is the single list of what gets released, as OpenTelemetry-Go's
// versions.yaml is: the release command and the publish check both read it.
package modset

import (
	"bytes"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/semver"
	"golang.org/x/mod/zip"
)

// Root is the library's module path; every module of the repository lives
// under it.
const Root = "github.com/idemgate/idemgate"

// A Module is one module of the repository.
type Module struct {
	// Dir is the module's directory relative to the repository root, in
	// slash form ("." for the root).
	Dir string
	// Path is the module path.
	Path string
	// Public modules are imported or installed by users: they are packed,
	// checked and tagged. The others (the example, tools, test-only
	// modules) only follow the version in their requirements.
	Public bool
}

// Tag is the tag Go expects for the module at version: the version itself
// at the root, else the directory and the version ("otelidem/v0.1.0").
func (m Module) Tag(version string) string {
	if m.Dir == "." {
		return version
	}
	return m.Dir + "/" + version
}

// public lists the modules users import or install, in release order.
var public = []string{".", "otelidem", "client", "cmd/idemgate"}

// Load returns the modules that go.work in root joins, public ones first.
// A public module missing from go.work is an error: it would escape the
// release.
func Load(root string) ([]Module, error) {
	data, err := os.ReadFile(filepath.Join(root, "go.work"))
	if err != nil {
		return nil, fmt.Errorf("modset: %w", err)
	}
	wf, err := modfile.ParseWork("go.work", data, nil)
	if err != nil {
		return nil, fmt.Errorf("modset: %w", err)
	}
	var mods []Module
	for _, u := range wf.Use {
		dir := filepath.ToSlash(filepath.Clean(u.Path))
		path, err := modulePath(filepath.Join(root, dir))
		if err != nil {
			return nil, err
		}
		if path != Root && !strings.HasPrefix(path, Root+"/") {
			return nil, fmt.Errorf("modset: %s: module %s is not under %s", dir, path, Root)
		}
		mods = append(mods, Module{Dir: dir, Path: path, Public: slices.Contains(public, dir)})
	}
	for _, dir := range public {
		if !slices.ContainsFunc(mods, func(m Module) bool { return m.Dir == dir }) {
			return nil, fmt.Errorf("modset: public module %s is not in go.work", dir)
		}
	}
	slices.SortStableFunc(mods, func(a, b Module) int {
		return index(a) - index(b)
	})
	return mods, nil
}

// index orders public modules as listed, then the others as go.work has them.
func index(m Module) int {
	if i := slices.Index(public, m.Dir); i >= 0 {
		return i
	}
	return len(public)
}

func modulePath(dir string) (string, error) {
	data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		return "", fmt.Errorf("modset: %w", err)
	}
	path := modfile.ModulePath(data)
	if path == "" {
		return "", fmt.Errorf("modset: %s/go.mod names no module", dir)
	}
	return path, nil
}

// CheckVersion reports whether v is a release version: canonical semver
// with a v, major version 0 or 1 (the module paths carry no /vN suffix).
func CheckVersion(v string) error {
	if !semver.IsValid(v) || semver.Canonical(v) != v || semver.Build(v) != "" {
		return fmt.Errorf("modset: %q is not a canonical version like v0.1.0", v)
	}
	if m := semver.Major(v); m != "v0" && m != "v1" {
		return fmt.Errorf("modset: %s needs a /%s module path suffix first", v, m)
	}
	return nil
}

// Required returns the version at which m requires the library, or "" if
// it does not require it.
func Required(root string, m Module) (string, error) {
	f, err := parse(root, m)
	if err != nil {
		return "", err
	}
	for _, r := range f.Require {
		if r.Mod.Path == Root {
			return r.Mod.Version, nil
		}
	}
	return "", nil
}

// Siblings returns the modules of the repository that m requires, with the
// versions it requires them at.
func Siblings(root string, m Module) (map[string]string, error) {
	f, err := parse(root, m)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, r := range f.Require {
		if r.Mod.Path == Root || strings.HasPrefix(r.Mod.Path, Root+"/") {
			out[r.Mod.Path] = r.Mod.Version
		}
	}
	return out, nil
}

// SetVersion makes every module in mods require each sibling it already
// requires at version, and keeps a replace directive to the sibling's
// directory so work inside the repository uses the working tree. A public
// module that users install with "go install path@version" (one with a
// package main at its root) gets no replace directive: Go refuses to
// install from a go.mod that has one; go.work joins it to its siblings
// instead. It returns the go.mod files it changed.
func SetVersion(root string, mods []Module, version string) ([]string, error) {
	if err := CheckVersion(version); err != nil {
		return nil, err
	}
	dirOf := map[string]string{}
	for _, m := range mods {
		dirOf[m.Path] = m.Dir
	}
	var changed []string
	for _, m := range mods {
		f, err := parse(root, m)
		if err != nil {
			return nil, err
		}
		installable, err := IsCommand(root, m)
		if err != nil {
			return nil, err
		}
		for _, r := range f.Require {
			dir, ok := dirOf[r.Mod.Path]
			if !ok {
				continue
			}
			if err := f.AddRequire(r.Mod.Path, version); err != nil {
				return nil, fmt.Errorf("modset: %s/go.mod: %w", m.Dir, err)
			}
			if installable && m.Public {
				if err := f.DropReplace(r.Mod.Path, ""); err != nil {
					return nil, fmt.Errorf("modset: %s/go.mod: %w", m.Dir, err)
				}
				continue
			}
			rel, err := filepath.Rel(filepath.FromSlash(m.Dir), filepath.FromSlash(dir))
			if err != nil {
				return nil, fmt.Errorf("modset: %w", err)
			}
			rel = filepath.ToSlash(rel)
			if hasReplace(f, r.Mod.Path, rel) {
				continue
			}
			if err := f.AddReplace(r.Mod.Path, "", rel, ""); err != nil {
				return nil, fmt.Errorf("modset: %s/go.mod: %w", m.Dir, err)
			}
		}
		f.Cleanup()
		out, err := f.Format()
		if err != nil {
			return nil, fmt.Errorf("modset: %s/go.mod: %w", m.Dir, err)
		}
		name := filepath.Join(root, m.Dir, "go.mod")
		old, err := os.ReadFile(name)
		if err != nil {
			return nil, fmt.Errorf("modset: %w", err)
		}
		if bytes.Equal(old, out) {
			continue
		}
		if err := os.WriteFile(name, out, 0o644); err != nil {
			return nil, fmt.Errorf("modset: %w", err)
		}
		changed = append(changed, filepath.ToSlash(filepath.Join(m.Dir, "go.mod")))
	}
	return changed, nil
}

// hasReplace reports whether f already replaces every version of modPath by
// the directory rel (written "../" or "..", as one likes).
func hasReplace(f *modfile.File, modPath, rel string) bool {
	for _, r := range f.Replace {
		if r.Old.Path == modPath && r.Old.Version == "" && r.New.Version == "" &&
			path.Clean(r.New.Path) == rel {
			return true
		}
	}
	return false
}

func parse(root string, m Module) (*modfile.File, error) {
	name := filepath.Join(root, m.Dir, "go.mod")
	data, err := os.ReadFile(name)
	if err != nil {
		return nil, fmt.Errorf("modset: %w", err)
	}
	f, err := modfile.Parse(name, data, nil)
	if err != nil {
		return nil, fmt.Errorf("modset: %w", err)
	}
	return f, nil
}

// IsCommand reports whether the module's root directory holds a package
// main, which users install with "go install path@version".
func IsCommand(root string, m Module) (bool, error) {
	files, err := filepath.Glob(filepath.Join(root, m.Dir, "*.go"))
	if err != nil {
		return false, fmt.Errorf("modset: %w", err)
	}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		data, err := os.ReadFile(name)
		if err != nil {
			return false, fmt.Errorf("modset: %w", err)
		}
		for line := range strings.Lines(string(data)) {
			if strings.HasPrefix(line, "package ") {
				if strings.TrimSpace(strings.TrimPrefix(line, "package ")) == "main" {
					return true, nil
				}
				break
			}
		}
	}
	return false, nil
}

// Pack writes m, as the working tree in root holds it, to the file-based
// module proxy in proxy at version: the .info, .mod and .zip files and the
// version list that GOPROXY=file://proxy serves. The zip is what the Go
// command would download for a tag at this tree: the module's files without
// its nested modules.
func Pack(root, proxy string, m Module, version string) error {
	esc, err := module.EscapePath(m.Path)
	if err != nil {
		return fmt.Errorf("modset: %w", err)
	}
	dir := filepath.Join(proxy, filepath.FromSlash(esc), "@v")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("modset: %w", err)
	}
	mv := module.Version{Path: m.Path, Version: version}
	base := filepath.Join(dir, version)
	zf, err := os.Create(base + ".zip")
	if err != nil {
		return fmt.Errorf("modset: %w", err)
	}
	err = zip.CreateFromDir(zf, mv, filepath.Join(root, m.Dir))
	if cerr := zf.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("modset: pack %s: %w", m.Path, err)
	}
	gomod, err := os.ReadFile(filepath.Join(root, m.Dir, "go.mod"))
	if err != nil {
		return fmt.Errorf("modset: %w", err)
	}
	if err := os.WriteFile(base+".mod", gomod, 0o644); err != nil {
		return fmt.Errorf("modset: %w", err)
	}
	info := fmt.Sprintf("{\"Version\":%q,\"Time\":\"2026-01-01T00:00:00Z\"}\n", version)
	if err := os.WriteFile(base+".info", []byte(info), 0o644); err != nil {
		return fmt.Errorf("modset: %w", err)
	}
	return os.WriteFile(filepath.Join(dir, "list"), []byte(version+"\n"), 0o644)
}
