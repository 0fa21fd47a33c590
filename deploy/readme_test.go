package deploy_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

var (
	backticked = regexp.MustCompile("`([^`]+)`")
	testFunc   = regexp.MustCompile(`^(Test|Fuzz|Benchmark|Example)[A-Za-z0-9_]*$`)
	pkgDir     = regexp.MustCompile(`^[a-z0-9_]+(/[a-z0-9_]+)*$`)
)

// namedTest is a test function a table names, with the package directory before it, and
// where: the document and its line.
type namedTest struct {
	dir, name string
	line      int
	doc       string
}

// testsOfRow reads the tests a table row names: `dir` `TestA`, `TestB`; `dir2` `TestC`.
// Each function belongs to the directory named last before it.
func testsOfRow(cell string, line int) (tests []namedTest, orphans []string) {
	dir := ""
	for _, m := range backticked.FindAllStringSubmatch(cell, -1) {
		tok := m[1]
		switch {
		case testFunc.MatchString(tok):
			if dir == "" {
				orphans = append(orphans, tok)
				continue
			}
			tests = append(tests, namedTest{dir: dir, name: tok, line: line})
		case pkgDir.MatchString(tok):
			dir = tok
		}
	}
	return tests, orphans
}

// testFuncs lists the top-level functions declared in the _test.go files of dir.
func testFuncs(t *testing.T, dir string) map[string]bool {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	funcs := map[string]bool{}
	fset := token.NewFileSet()
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, e.Name()), nil, parser.SkipObjectResolution)
		require.NoError(t, err)
		for _, d := range f.Decls {
			if fn, ok := d.(*ast.FuncDecl); ok && fn.Recv == nil {
				funcs[fn.Name.Name] = true
			}
		}
	}
	return funcs
}

// guaranteesDoc holds the table "guarantee | test (package and name)", under guaranteesTitle.
const (
	guaranteesDoc   = "docs/guarantees.md"
	guaranteesTitle = "# Guarantees, and the test that proves each"
)

// docsNamingTests are the documents whose tables may name tests besides the table of
// guarantees: every test they name must exist too.
var docsNamingTests = []string{"README.md"}

// The table of guarantees (docs/guarantees.md) names, for each guarantee, the package
// directory and the test function that proves it. Every row must name at least one test, and
// every test named in any table of that file or of the README must exist in its directory,
// so the tables cannot rot when a test is renamed, moved or deleted.
func TestGuaranteesNameRealTests(t *testing.T) {
	named, guarantees := tablesOf(t, guaranteesDoc, guaranteesTitle)
	require.GreaterOrEqual(t, guarantees, 20, "%s: the table under %q is missing or cut short", guaranteesDoc, guaranteesTitle)
	for _, doc := range docsNamingTests {
		more, _ := tablesOf(t, doc, "")
		named = append(named, more...)
	}

	funcs := map[string]map[string]bool{}
	for _, nt := range named {
		if funcs[nt.dir] == nil {
			info, err := os.Stat(filepath.Join("..", nt.dir))
			if err != nil || !info.IsDir() {
				t.Errorf("%s:%d: %s: no package directory %s", nt.doc, nt.line, nt.name, nt.dir)
				funcs[nt.dir] = map[string]bool{}
				continue
			}
			funcs[nt.dir] = testFuncs(t, filepath.Join("..", nt.dir))
		}
		if !funcs[nt.dir][nt.name] {
			t.Errorf("%s:%d: %s names %s, which %s's tests do not declare", nt.doc, nt.line, nt.dir, nt.name, nt.dir)
		}
	}
}

// tablesOf reads the tests named in the tables of doc (a path from the repository root).
// Under the heading title (none when empty) the first table must be the table of
// guarantees: each of its rows names a test; guarantees counts them.
func tablesOf(t *testing.T, doc, title string) (named []namedTest, guarantees int) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", doc))
	require.NoError(t, err)
	lines := strings.Split(string(raw), "\n")

	inGuarantees, inTable := false, false
	for i, line := range lines {
		if strings.HasPrefix(line, "#") {
			inGuarantees = title != "" && strings.TrimSpace(line) == title
		}
		if !strings.HasPrefix(line, "|") {
			inTable = false
			continue
		}
		header := !inTable
		inTable = true
		if header || strings.HasPrefix(line, "|---") {
			if inGuarantees && header {
				require.Equal(t, "| guarantee | test (package and name) |", strings.TrimSpace(line), "%s:%d", doc, i+1)
			}
			continue
		}
		cells := strings.Split(strings.Trim(strings.TrimSpace(line), "|"), "|")
		tests, orphans := testsOfRow(cells[len(cells)-1], i+1)
		for j := range tests {
			tests[j].doc = doc
		}
		if inGuarantees {
			guarantees++
			if len(tests) == 0 {
				t.Errorf("%s:%d: a guarantee without a test (`dir` `TestName`): %s", doc, i+1, line)
			}
			if len(orphans) > 0 {
				t.Errorf("%s:%d: %v: no package directory before them", doc, i+1, orphans)
			}
		}
		named = append(named, tests...)
	}
	return named, guarantees
}

// The parser itself: a function belongs to the directory named last before it.
func TestTestsOfRow(t *testing.T) {
	tests, orphans := testsOfRow(" `internal/api` `TestA`, `TestB`; `chaos` `TestC`; `200` `FuzzD` ", 7)
	require.Equal(t, []namedTest{{"internal/api", "TestA", 7, ""}, {"internal/api", "TestB", 7, ""}, {"chaos", "TestC", 7, ""}, {"200", "FuzzD", 7, ""}}, tests)
	require.Empty(t, orphans)
	_, orphans = testsOfRow("`TestLonely` in `pkg/x`", 1)
	require.Equal(t, []string{"TestLonely"}, orphans)
}
