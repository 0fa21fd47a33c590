package config

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

const (
	module = "github.com/metergate/metergate"
	root   = "../.."
	// configDoc holds the table of every environment variable: one row per variable,
	// "| `NAME` | binaries | default | meaning |".
	configDoc = "docs/config.md"
)

// binaries are the configurations of the three commands, by command name.
func binaries() map[string]Registrar {
	return map[string]Registrar{"admit": &Admit{}, "meter": &Meter{}, "reconcile": &Reconcile{}}
}

// docRow is one row of docs/config.md's table of environment variables.
type docRow struct {
	usedBy []string
	def    string
	line   int
}

var (
	envRow   = regexp.MustCompile("^\\|\\s*`([A-Z][A-Z0-9_]*)`\\s*\\|([^|]*)\\|([^|]*)\\|")
	oneValue = regexp.MustCompile("^`([^`]*)`$")
)

// documented reads docs/config.md's table of environment variables: the table whose header is
// "| variable | used by | default | meaning |".
func documented(t *testing.T) map[string]docRow {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(root, configDoc))
	require.NoError(t, err)
	rows := map[string]docRow{}
	in := false
	for i, line := range strings.Split(string(raw), "\n") {
		switch {
		case strings.HasPrefix(line, "| variable | used by | default | meaning |"):
			require.False(t, in || len(rows) > 0, "%s:%d: a second table of variables", configDoc, i+1)
			in = true
		case in && !strings.HasPrefix(line, "|"):
			in = false
		case in:
			m := envRow.FindStringSubmatch(line)
			if m == nil {
				require.True(t, strings.HasPrefix(line, "|---"), "%s:%d: not a row of the variables table: %s", configDoc, i+1, line)
				continue
			}
			_, dup := rows[m[1]]
			require.False(t, dup, "%s:%d: %s documented twice", configDoc, i+1, m[1])
			var used []string
			for _, b := range strings.Split(m[2], ",") {
				used = append(used, strings.TrimSpace(b))
			}
			slices.Sort(used)
			rows[m[1]] = docRow{usedBy: used, def: strings.TrimSpace(m[3]), line: i + 1}
		}
	}
	require.NotEmpty(t, rows, "%s has no table headed \"| variable | used by | default | meaning |\"", configDoc)
	return rows
}

// Every environment variable a binary reads is a row of docs/config.md's table, naming exactly
// the binaries that read it and the default each registers; and every row is a variable
// some binary reads. The variables are those the configuration registers plus any
// os.Getenv / os.LookupEnv of a constant name in the code each binary is built from.
func TestEveryVariableIsDocumented(t *testing.T) {
	docs := documented(t)

	readers := map[string][]string{} // variable → binaries
	defaults := map[string]func(doc string) error{}
	for name, cfg := range binaries() {
		l := NewLoader(name, func(string) (string, bool) { return "", false }, io.Discard)
		cfg.Register(l)
		for _, env := range l.Names() {
			readers[env] = append(readers[env], name)
			f := l.fs.Lookup(FlagName(env))
			require.NotNil(t, f, "%s: no flag for %s", name, env)
			defaults[env] = defaultChecker(env, f.DefValue, f.Value)
		}
		for _, env := range envReads(t, "cmd/"+name) {
			if !slices.Contains(readers[env], name) {
				readers[env] = append(readers[env], name)
			}
		}
	}

	for env, bins := range readers {
		slices.Sort(bins)
		row, ok := docs[env]
		if !assertf(t, ok, "%s (read by %s) is missing from the table of variables in %s", env, strings.Join(bins, ", "), configDoc) {
			continue
		}
		assertf(t, slices.Equal(row.usedBy, bins), "%s:%d: %s is read by %s, the table says %s",
			configDoc, row.line, env, strings.Join(bins, ", "), strings.Join(row.usedBy, ", "))
		if check, ok := defaults[env]; ok {
			if err := check(row.def); err != nil {
				t.Errorf("%s:%d: %s: %v", configDoc, row.line, env, err)
			}
		}
	}
	for env, row := range docs {
		assertf(t, readers[env] != nil, "%s:%d: %s is documented but no binary reads it", configDoc, row.line, env)
	}
}

func assertf(t *testing.T, ok bool, format string, args ...any) bool {
	t.Helper()
	if !ok {
		t.Errorf(format, args...)
	}
	return ok
}

// defaultChecker compares the default written in docs/config.md (a backticked value, "—" for
// none, "the host name" for ADMIT_NODE) with the one registered.
func defaultChecker(env, registered string, v any) func(doc string) error {
	return func(doc string) error {
		switch {
		case strings.HasPrefix(doc, "—"):
			if registered != "" {
				return fmt.Errorf("default %q, the table says none", registered)
			}
			return nil
		case env == "ADMIT_NODE" && doc == "the host name":
			return nil
		}
		m := oneValue.FindStringSubmatch(doc)
		if m == nil {
			return fmt.Errorf("default %q: want one `value`, or — for none", doc)
		}
		if _, isDuration := v.(*value[time.Duration]); isDuration {
			want, err1 := time.ParseDuration(registered)
			got, err2 := time.ParseDuration(m[1])
			if err1 != nil || err2 != nil || got != want {
				return fmt.Errorf("default %s, the table says %s", registered, m[1])
			}
			return nil
		}
		if m[1] != registered {
			return fmt.Errorf("default %q, the table says %q", registered, m[1])
		}
		return nil
	}
}

// envReads lists the constant names passed to os.Getenv or os.LookupEnv in the non-test
// code of dir and of every package of this module it imports, directly or not. A name the
// scan cannot resolve to a constant fails the test: it could not be checked.
func envReads(t *testing.T, dir string) []string {
	t.Helper()
	var names []string
	seen := map[string]bool{}
	queue := []string{dir}
	for len(queue) > 0 {
		d := queue[0]
		queue = queue[1:]
		if seen[d] {
			continue
		}
		seen[d] = true
		files := parseDir(t, filepath.Join(root, d))
		consts := map[string]string{}
		for _, f := range files {
			for _, decl := range f.Decls {
				g, ok := decl.(*ast.GenDecl)
				if !ok || g.Tok != token.CONST {
					continue
				}
				for _, spec := range g.Specs {
					vs := spec.(*ast.ValueSpec)
					for i, n := range vs.Names {
						if i < len(vs.Values) {
							if s, ok := stringLit(vs.Values[i]); ok {
								consts[n.Name] = s
							}
						}
					}
				}
			}
		}
		for _, f := range files {
			for _, imp := range f.Imports {
				p, _ := strconv.Unquote(imp.Path.Value)
				if rest, ok := strings.CutPrefix(p, module+"/"); ok {
					queue = append(queue, rest)
				}
			}
			ast.Inspect(f, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok || len(call.Args) != 1 {
					return true
				}
				sel, ok := call.Fun.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				if pkg, ok := sel.X.(*ast.Ident); !ok || pkg.Name != "os" || (sel.Sel.Name != "Getenv" && sel.Sel.Name != "LookupEnv") {
					return true
				}
				name, ok := stringLit(call.Args[0])
				if id, isIdent := call.Args[0].(*ast.Ident); isIdent {
					name, ok = consts[id.Name]
				}
				if !ok {
					t.Errorf("%s: os.%s of a name that is not a constant of its package: document it and teach this test", d, sel.Sel.Name)
					return true
				}
				if !slices.Contains(names, name) {
					names = append(names, name)
				}
				return true
			})
		}
	}
	return names
}

func parseDir(t *testing.T, dir string) []*ast.File {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var files []*ast.File
	fset := token.NewFileSet()
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, e.Name()), nil, parser.SkipObjectResolution)
		require.NoError(t, err)
		files = append(files, f)
	}
	return files
}

func stringLit(e ast.Expr) (string, bool) {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return "", false
	}
	s, err := strconv.Unquote(lit.Value)
	return s, err == nil
}
