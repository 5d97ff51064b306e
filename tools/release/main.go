// Command release releases every public module of the repository at one
// version (docs/releasing.md):
//
//	go run ./tools/release -version v0.1.0
//
// It sets the version in every sibling requirement of every module (a
// commit when that changes a go.mod), checks that CHANGELOG.md has a
// section for the version, runs the publish check against the tree it is
// about to tag, and creates the tags Go expects for a multi-module
// repository: v0.1.0, otelidem/v0.1.0, client/v0.1.0, cmd/idemgate/v0.1.0.
// It pushes nothing; it prints the push command.
//
// With -set it only rewrites the requirements (no commit, no tags): the
// step to take right after a release, or to try a version.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"

	"golang.org/x/mod/semver"

	"github.com/idemgate/idemgate/tools/internal/modset"
)

func main() {
	fs := flag.NewFlagSet("release", flag.ContinueOnError)
	version := fs.String("version", "", "the version to release, like v0.1.0 (required)")
	dir := fs.String("C", ".", "the repository's root directory")
	setOnly := fs.Bool("set", false, "only set the version in every module's requirements")
	skipCheck := fs.Bool("skip-publish-check", false, "do not run the publish check (for the release command's own test)")
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	if *version == "" || fs.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: release -version vX.Y.Z [-set] [-C dir]")
		os.Exit(2)
	}
	r := releaser{root: *dir, version: *version, out: os.Stdout}
	var err error
	if *setOnly {
		err = r.set()
	} else {
		err = r.release(!*skipCheck)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

type releaser struct {
	root    string
	version string
	out     io.Writer
}

func (r releaser) set() error {
	if err := modset.CheckVersion(r.version); err != nil {
		return fmt.Errorf("release: %w", err)
	}
	mods, err := modset.Load(r.root)
	if err != nil {
		return fmt.Errorf("release: %w", err)
	}
	changed, err := modset.SetVersion(r.root, mods, r.version)
	if err != nil {
		return fmt.Errorf("release: %w", err)
	}
	for _, name := range changed {
		fmt.Fprintln(r.out, "set", r.version, "in", name)
	}
	return nil
}

func (r releaser) release(publishCheck bool) error {
	if err := modset.CheckVersion(r.version); err != nil {
		return fmt.Errorf("release: %w", err)
	}
	// A tag names a commit, and the publish check packs the working tree:
	// the two are the same only on a clean tree.
	if st, err := r.git("status", "--porcelain"); err != nil {
		return err
	} else if st != "" {
		return fmt.Errorf("release: the working tree has changes; commit or remove them first:\n%s", st)
	}
	mods, err := modset.Load(r.root)
	if err != nil {
		return fmt.Errorf("release: %w", err)
	}
	for _, m := range mods {
		if !m.Public {
			continue
		}
		if _, err := r.git("rev-parse", "-q", "--verify", "refs/tags/"+m.Tag(r.version)); err == nil {
			return fmt.Errorf("release: tag %s exists already", m.Tag(r.version))
		}
	}
	// Go picks the highest version: an older one tagged now would never be
	// chosen by "go get …@latest".
	existing, err := r.git("tag", "-l", "v*")
	if err != nil {
		return err
	}
	for _, t := range strings.Fields(existing) {
		if semver.IsValid(t) && semver.Compare(t, r.version) >= 0 {
			return fmt.Errorf("release: %s is not newer than the tag %s", r.version, t)
		}
	}
	if err := checkChangelog(filepath.Join(r.root, "CHANGELOG.md"), r.version); err != nil {
		return err
	}
	changed, err := modset.SetVersion(r.root, mods, r.version)
	if err != nil {
		return fmt.Errorf("release: %w", err)
	}
	if publishCheck {
		cmd := exec.Command("go", "run", "./tools/publishcheck", "-version", r.version)
		cmd.Dir, cmd.Stdout, cmd.Stderr = r.root, r.out, os.Stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("release: publish check: %w (go.mod changes left uncommitted)", err)
		}
	}
	if len(changed) > 0 {
		if _, err := r.git(append([]string{"add", "--"}, changed...)...); err != nil {
			return err
		}
		msg := "release " + r.version + ": every module requires its siblings at " + r.version
		if _, err := r.git(append([]string{"commit", "-q", "-m", msg, "--"}, changed...)...); err != nil {
			return err
		}
		fmt.Fprintln(r.out, "committed", strings.Join(changed, " "))
	}
	var tags []string
	for _, m := range mods {
		if !m.Public {
			continue
		}
		tag := m.Tag(r.version)
		if _, err := r.git("tag", "-a", tag, "-m", m.Path+" "+r.version); err != nil {
			return err
		}
		tags = append(tags, tag)
		fmt.Fprintln(r.out, "tagged", tag)
	}
	fmt.Fprintf(r.out, "push with: git push origin HEAD %s\n", strings.Join(tags, " "))
	return nil
}

// git runs git in the repository and returns its trimmed output.
func (r releaser) git(args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = r.root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("release: git %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(string(out)), nil
}

// checkChangelog reports an error unless the changelog has a section for
// version, headed as Keep a Changelog heads one: "## [0.1.0] - 2026-12-05".
func checkChangelog(name, version string) error {
	data, err := os.ReadFile(name)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("release: no %s", filepath.Base(name))
	}
	if err != nil {
		return fmt.Errorf("release: %w", err)
	}
	head := regexp.MustCompile(`(?m)^## \[` + regexp.QuoteMeta(strings.TrimPrefix(version, "v")) + `\] - \d{4}-\d{2}-\d{2}\s*$`)
	if !head.Match(data) {
		return fmt.Errorf("release: %s has no section \"## [%s] - YYYY-MM-DD\"", filepath.Base(name), strings.TrimPrefix(version, "v"))
	}
	return nil
}
