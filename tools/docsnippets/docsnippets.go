// Package docsnippets compiles the Go snippets of README.md and docs/*.md,
// so that a renamed API cannot leave a stale snippet behind: its test
// (part of make test) fails on the first snippet that does not build or
// vet.
//
// A snippet that starts with "package" is a whole file and builds as it
// is. Any other snippet is a fragment: top-level declarations when it
// parses as such, else statements, which become the body of a function.
// Either way it is given the imports it uses, under the names the docs use
// (idem for idemgate's middleware, middleware for echo's), and the
// declarations it uses from a small prelude of the names the docs assume
// (ctx, e, pool, rdb, store, tasks, records, …). A variable a statement
// fragment declares and never reads is read by the generated code, so
// that a snippet may show a result without using it.
//
// Markers, HTML comments on the line before the fence:
//
//	<!-- snippet: skip -->            not compiled (say why next to it)
//	<!-- snippet: mirrors pgstore.Stats -->
//	                                  the snippet declares a copy of the
//	                                  type; it must convert to the real one,
//	                                  so the copy lists the same fields
package docsnippets

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/format"
	"go/parser"
	"go/scanner"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// A Snippet is one Go code block of a Markdown file.
type Snippet struct {
	File string // the Markdown file, relative to the repository root
	Line int    // the line of the opening fence
	Code string
	// Mark is the snippet's marker ("skip", "mirrors pgstore.Stats"), or "".
	Mark string
}

func (s Snippet) String() string { return fmt.Sprintf("%s:%d", s.File, s.Line) }

var (
	fence  = regexp.MustCompile("^([ \t]*)```(\\S*)")
	marker = regexp.MustCompile(`^\s*<!--\s*snippet:\s*(.*?)\s*-->\s*$`)
)

// Extract returns the ```go blocks of the Markdown text, with the
// indentation of an indented fence (a block in a list item) removed.
func Extract(file, text string) []Snippet {
	var out []Snippet
	lines := strings.Split(text, "\n")
	for i := 0; i < len(lines); i++ {
		m := fence.FindStringSubmatch(lines[i])
		if m == nil {
			continue
		}
		indent, lang := m[1], m[2]
		start := i
		var code []string
		for i++; i < len(lines) && !strings.HasPrefix(strings.TrimSpace(lines[i]), "```"); i++ {
			code = append(code, strings.TrimPrefix(lines[i], indent))
		}
		if lang != "go" {
			continue
		}
		s := Snippet{File: file, Line: start + 1, Code: strings.Join(code, "\n") + "\n"}
		if start > 0 {
			if mm := marker.FindStringSubmatch(lines[start-1]); mm != nil {
				s.Mark = mm[1]
			}
		}
		out = append(out, s)
	}
	return out
}

// imports are the packages a snippet may use, by the name the docs give
// them.
var imports = map[string]string{
	"context":     "context",
	"errors":      "errors",
	"fmt":         "fmt",
	"http":        "net/http",
	"json":        "encoding/json",
	"log":         "log",
	"os":          "os",
	"slog":        "log/slog",
	"testing":     "testing",
	"time":        "time",
	"echo":        "github.com/labstack/echo/v4",
	"middleware":  "github.com/labstack/echo/v4/middleware",
	"echojwt":     "github.com/labstack/echo-jwt/v4",
	"jwt":         "github.com/golang-jwt/jwt/v5",
	"redis":       "github.com/redis/go-redis/v9",
	"pgx":         "github.com/jackc/pgx/v5",
	"pgxpool":     "github.com/jackc/pgx/v5/pgxpool",
	"metric":      "go.opentelemetry.io/otel/metric",
	"trace":       "go.opentelemetry.io/otel/trace",
	"idemgate":    "github.com/idemgate/idemgate",
	"idem":        "github.com/idemgate/idemgate/middleware",
	"redisstore":  "github.com/idemgate/idemgate/redisstore",
	"idemhttp":    "github.com/idemgate/idemgate/idemhttp",
	"storetest":   "github.com/idemgate/idemgate/storetest",
	"fingerprint": "github.com/idemgate/idemgate/fingerprint",
	"keyspace":    "github.com/idemgate/idemgate/keyspace",
	"pgstore":     "github.com/idemgate/idemgate/pgstore",
	"pgrecords":   "github.com/idemgate/idemgate/pgrecords",
	"otelidem":    "github.com/idemgate/idemgate/otelidem",
	"otelpgstore": "github.com/idemgate/idemgate/otelidem/otelpgstore",
	"client":      "github.com/idemgate/idemgate/client",
	"rate":        "golang.org/x/time/rate",
}

// prelude declares the names the docs use without declaring them.
var prelude = map[string]string{
	"ctx":            "var ctx = context.Background()",
	"e":              "var e = echo.New()",
	"pool":           "var pool *pgxpool.Pool",
	"rdb":            "var rdb *redis.Client",
	"store":          "var store *pgstore.Store",
	"tasks":          "var tasks *pgstore.Store",
	"records":        "var records *pgrecords.Store",
	"mp":             "var mp metric.MeterProvider",
	"tp":             "var tp trace.TracerProvider",
	"images":         "var images idem.Config",
	"cfg":            "var cfg idem.Config",
	"scope":          "func scope(c echo.Context) (tenant, user string, err error) { return }",
	"scopeFromJWT":   "func scopeFromJWT(c echo.Context) (tenant, user string, err error) { return }",
	"createImage":    "func createImage(c echo.Context) error { return nil }",
	"newTask":        "var newTask pgstore.NewTask",
	"a":              "var a pgstore.NewTask",
	"b":              "var b pgstore.NewTask",
	"c":              "var c pgstore.NewTask",
	"id":             "var id string",
	"one":            "var one idemgate.Store",
	"two":            "var two idemgate.Store",
	"run":            "func run(ctx context.Context, t pgstore.Task) pgstore.Outcome { return pgstore.Outcome{} }",
	"handle":         "func handle(ctx context.Context, t pgstore.Task) pgstore.Outcome { return pgstore.Outcome{} }",
	"reconcile":      "func reconcile(ctx context.Context, t pgstore.Task) pgstore.Outcome { return pgstore.Outcome{} }",
	"askTheUpstream": "func askTheUpstream(ctx context.Context, t pgstore.Task) pgstore.Outcome { return pgstore.Outcome{} }",
	"export":         "func export(c echo.Context) error { return nil }",
	"refundHandler":  "var refundHandler http.Handler",
	"mux":            "var mux = http.NewServeMux()",
	"scopeOf":        "func scopeOf(r *http.Request) (tenant, user string, err error) { return }",
	"createOrder":    "func createOrder(c echo.Context) error { return nil }",
	"charge":         "func charge(ctx context.Context) ([]byte, error) { return nil, nil }",
	"imagesHandler":  "var imagesHandler http.Handler",
	"auth":           "var auth struct{ FromContext func(context.Context) (struct{ Tenant, User string }, bool) }",
	// A stand-in for a paid upstream API that takes an idempotency key.
	"upstream":    "var upstream interface { Generate(ctx context.Context, params json.RawMessage, idempotencyKey string) ([]json.RawMessage, error) }",
	"params":      "var params json.RawMessage",
	"isTransient": "func isTransient(err error) bool { return false }",
	// A queue consumer's message and its acknowledgements (docs/consumers.md).
	"msg":        "var msg struct{ ID string; Body []byte }",
	"chargeCard": "func chargeCard(ctx context.Context, body []byte) ([]byte, error) { return nil, nil }",
	"ack":        "func ack() {}",
	"nack":       "func nack() {}",
	"nackAfter":  "func nackAfter(time.Duration) {}",
}

// Generate returns the Go file that compiles s as package pkg, or an error
// if s is not Go.
func Generate(s Snippet, pkg string) ([]byte, error) {
	if strings.HasPrefix(s.Code, "package ") {
		return []byte(s.Code), nil
	}
	var mirror string
	if name, ok := strings.CutPrefix(s.Mark, "mirrors "); ok {
		mirror = name
	}
	body, stmts, err := parseFragment(s)
	if err != nil {
		return nil, err
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "snippet.go", "package "+pkg+"\n"+body, parser.SkipObjectResolution)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s, err)
	}
	declared := map[string]bool{}
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if d.Recv == nil {
				declared[d.Name.Name] = true
			}
		case *ast.GenDecl:
			for _, sp := range d.Specs {
				switch sp := sp.(type) {
				case *ast.TypeSpec:
					declared[sp.Name.Name] = true
				case *ast.ValueSpec:
					for _, n := range sp.Names {
						declared[n.Name] = true
					}
				}
			}
		}
	}
	if stmts {
		readUnread(f)
	}
	var src bytes.Buffer
	if err := format.Node(&src, fset, f); err != nil {
		return nil, fmt.Errorf("%s: %w", s, err)
	}
	code := strings.SplitN(src.String(), "\n", 2)[1]

	// Add the prelude declarations the code uses, then the imports that
	// code and prelude use.
	var decls []string
	used := idents(code)
	if mirror != "" {
		pkgName, typ, _ := strings.Cut(mirror, ".")
		used[pkgName] = true
		// The copy names the package's types unqualified, as its doc does.
		for _, name := range typeNames(f) {
			if !declared[name] {
				decls = append(decls, fmt.Sprintf("type %s = %s.%s", name, pkgName, name))
			}
		}
		decls = append(decls, fmt.Sprintf("var _ = %s.%s(%s{}) // the copy has the real type's fields", pkgName, typ, typ))
	}
	for name, d := range prelude {
		if used[name] && !declared[name] {
			decls = append(decls, d)
		}
	}
	slices.Sort(decls)
	usedAll := idents(code + "\n" + strings.Join(decls, "\n"))
	var imps []string
	for name, path := range imports {
		if usedAll[name] && !declared[name] {
			imps = append(imps, fmt.Sprintf("%s %q", name, path))
		}
	}
	slices.Sort(imps)
	var out bytes.Buffer
	fmt.Fprintf(&out, "// Generated from %s.\n\npackage %s\n\n", s, pkg)
	if len(imps) > 0 {
		fmt.Fprintf(&out, "import (\n\t%s\n)\n\n", strings.Join(imps, "\n\t"))
	}
	for _, d := range decls {
		out.WriteString(d + "\n")
	}
	out.WriteString("\n" + code)
	return out.Bytes(), nil
}

// typeNames returns the exported bare identifiers the file's type
// declarations use in type positions (not field names).
func typeNames(f *ast.File) []string {
	var names []string
	var visit func(n ast.Node) bool
	visit = func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.Field:
			ast.Inspect(n.Type, visit)
			return false
		case *ast.SelectorExpr:
			return false // qualified: pkg.Name
		case *ast.Ident:
			if ast.IsExported(n.Name) && !slices.Contains(names, n.Name) {
				names = append(names, n.Name)
			}
		}
		return true
	}
	for _, d := range f.Decls {
		if gd, ok := d.(*ast.GenDecl); ok && gd.Tok == token.TYPE {
			for _, sp := range gd.Specs {
				ast.Inspect(sp.(*ast.TypeSpec).Type, visit)
			}
		}
	}
	return names
}

// parseFragment returns the snippet as top-level declarations, or as the
// body of a function when it is statements (stmts).
func parseFragment(s Snippet) (body string, stmts bool, err error) {
	if _, err := parser.ParseFile(token.NewFileSet(), "", "package p\n"+s.Code, parser.SkipObjectResolution); err == nil {
		return s.Code, false, nil
	}
	// A fragment may return an error, as a handler or main's helper would.
	wrapped := "func _() error {\n" + s.Code + "}\n"
	if _, err := parser.ParseFile(token.NewFileSet(), "", "package p\n"+wrapped, parser.SkipObjectResolution); err != nil {
		return "", false, fmt.Errorf("%s: neither declarations nor statements: %w", s, err)
	}
	return wrapped, true, nil
}

// readUnread adds "_ = v" after each statement of a statement fragment's
// top level that declares v, so that a snippet may show a result it does
// not read, and a final "return nil" unless the fragment returns.
func readUnread(f *ast.File) {
	for _, d := range f.Decls {
		fd, ok := d.(*ast.FuncDecl)
		if !ok || fd.Name.Name != "_" || fd.Body == nil {
			continue
		}
		var list []ast.Stmt
		for _, st := range fd.Body.List {
			list = append(list, st)
			var names []*ast.Ident
			switch st := st.(type) {
			case *ast.AssignStmt:
				if st.Tok == token.DEFINE {
					for _, l := range st.Lhs {
						if id, ok := l.(*ast.Ident); ok {
							names = append(names, id)
						}
					}
				}
			case *ast.DeclStmt:
				if gd, ok := st.Decl.(*ast.GenDecl); ok && gd.Tok == token.VAR {
					for _, sp := range gd.Specs {
						names = append(names, sp.(*ast.ValueSpec).Names...)
					}
				}
			}
			for _, id := range names {
				if id.Name != "_" {
					list = append(list, &ast.AssignStmt{
						Lhs: []ast.Expr{ast.NewIdent("_")},
						Tok: token.ASSIGN,
						Rhs: []ast.Expr{ast.NewIdent(id.Name)},
					})
				}
			}
		}
		if len(list) == 0 {
			list = append(list, &ast.ReturnStmt{Results: []ast.Expr{ast.NewIdent("nil")}})
		} else if _, ok := list[len(list)-1].(*ast.ReturnStmt); !ok {
			list = append(list, &ast.ReturnStmt{Results: []ast.Expr{ast.NewIdent("nil")}})
		}
		fd.Body.List = list
	}
}

// idents returns the identifiers that occur in Go source (a superset of
// the names it uses: good enough to pick imports and prelude entries).
func idents(src string) map[string]bool {
	out := map[string]bool{}
	fset := token.NewFileSet()
	var sc scanner.Scanner
	sc.Init(fset.AddFile("", fset.Base(), len(src)), []byte(src), nil, 0)
	for {
		_, tok, lit := sc.Scan()
		if tok == token.EOF {
			return out
		}
		if tok == token.IDENT {
			out[lit] = true
		}
	}
}

// Write writes every snippet of the Markdown files under root (README.md
// and docs/*.md) into a module in dir, one package each, and returns the
// snippets it wrote, by package directory.
func Write(root, dir string) (map[string]Snippet, error) {
	files, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		return nil, err
	}
	files = append([]string{filepath.Join(root, "README.md")}, files...)
	written := map[string]Snippet{}
	for _, name := range files {
		data, err := os.ReadFile(name)
		if err != nil {
			return nil, err
		}
		rel, _ := filepath.Rel(root, name)
		for _, s := range Extract(filepath.ToSlash(rel), string(data)) {
			if s.Mark == "skip" {
				continue
			}
			pkg := fmt.Sprintf("s%02d", len(written)+1)
			src, err := Generate(s, pkg)
			if err != nil {
				return nil, err
			}
			if bytes.HasPrefix(src, []byte("package main")) {
				pkg += "main"
			}
			if err := os.MkdirAll(filepath.Join(dir, pkg), 0o755); err != nil {
				return nil, err
			}
			if err := os.WriteFile(filepath.Join(dir, pkg, "snippet.go"), src, 0o644); err != nil {
				return nil, err
			}
			written[pkg] = s
		}
	}
	return written, nil
}
