package deploy_test

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"

	"github.com/stretchr/testify/require"
)

var (
	// docRef is a reference to a document of docs/ from anywhere (a comment, a message, a
	// page): docs/x.md, docs/x.md#anchor.
	docRef = regexp.MustCompile(`\bdocs/([a-z0-9_-]+\.md)(#[a-z0-9_-]+)?`)
	// mdLink is a markdown link to a file beside the page or below it: (x.md#anchor).
	mdLink = regexp.MustCompile(`\]\(([a-zA-Z0-9_./-]+\.md)?(#[a-z0-9_-]+)?\)`)
	// outside names a document that is not in the repository (the design notes live
	// elsewhere): a reader of the code cannot follow it.
	outside  = regexp.MustCompile(`\bDESIGN\.md\b`)
	heading  = regexp.MustCompile("(?m)^#{1,6} +(.+?) *$")
	fenced   = regexp.MustCompile("(?ms)^```.*?^```")
	slugDrop = regexp.MustCompile(`[^\p{L}\p{N} _-]`)
)

// slug is GitHub's anchor of a heading: lowercase, punctuation dropped, spaces to dashes.
func slug(h string) string {
	h = strings.ReplaceAll(h, "`", "")
	h = slugDrop.ReplaceAllString(strings.Map(unicode.ToLower, h), "")
	return strings.ReplaceAll(h, " ", "-")
}

// anchors returns the anchors of a markdown page's headings (a repeated heading's second
// anchor ends in -1, as GitHub names it).
func anchors(page string) map[string]bool {
	seen := map[string]int{}
	out := map[string]bool{}
	for _, m := range heading.FindAllStringSubmatch(fenced.ReplaceAllString(page, ""), -1) {
		s := slug(m[1])
		if n := seen[s]; n > 0 {
			out[fmt.Sprintf("%s-%d", s, n)] = true
		} else {
			out[s] = true
		}
		seen[s]++
	}
	return out
}

// TestDocReferencesResolve: every docs/x.md#anchor named in the code, the configs and the
// documents, and every markdown link to a page, leads to a page and a heading that exist;
// nothing points at a document outside the repository.
func TestDocReferencesResolve(t *testing.T) {
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	pages := map[string]map[string]bool{} // path from root → its anchors
	page := func(rel string) (map[string]bool, bool) {
		if a, ok := pages[rel]; ok {
			return a, a != nil
		}
		raw, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			pages[rel] = nil
			return nil, false
		}
		pages[rel] = anchors(string(raw))
		return pages[rel], true
	}
	var problems []string
	reported := map[string]bool{}
	report := func(p string) {
		if !reported[p] {
			reported[p] = true
			problems = append(problems, p)
		}
	}
	check := func(from, target, anchor string) {
		a, ok := page(target)
		switch {
		case !ok:
			report(fmt.Sprintf("%s: %s does not exist", from, target))
		case anchor != "" && !a[strings.TrimPrefix(anchor, "#")]:
			report(fmt.Sprintf("%s: %s has no heading %s", from, target, anchor))
		}
	}
	files := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (strings.HasPrefix(name, ".") || name == "node_modules" || name == "testdata" || name == "bin") {
				return filepath.SkipDir
			}
			return nil
		}
		switch filepath.Ext(name) {
		case ".go", ".md", ".yaml", ".yml", ".sh", ".lua", ".sql":
		default:
			if name != "Makefile" {
				return nil
			}
		}
		raw, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		files++
		rel, _ := filepath.Rel(root, path)
		for i, line := range strings.Split(string(raw), "\n") {
			from := fmt.Sprintf("%s:%d", rel, i+1)
			if rel == "deploy/links_test.go" {
				break // its own examples
			}
			if outside.MatchString(line) {
				report(from + ": names DESIGN.md, which is not in the repository")
			}
			for _, m := range docRef.FindAllStringSubmatch(line, -1) {
				check(from, "docs/"+m[1], m[2])
			}
			if filepath.Ext(name) != ".md" {
				continue
			}
			for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
				target := rel
				if m[1] != "" {
					target = filepath.Join(filepath.Dir(rel), m[1])
				}
				if m[1] != "" || m[2] != "" {
					check(from, target, m[2])
				}
			}
		}
		return nil
	})
	require.NoError(t, err)
	require.Greater(t, files, 100, "the walk found the repository's files")
	require.Empty(t, problems, "references that lead nowhere:\n%s", strings.Join(problems, "\n"))
}

func TestSlug(t *testing.T) {
	require.Equal(t, "the-policy-mirror", slug("The policy mirror"))
	require.Equal(t, "the-local-stacks-state-make-up-deploylocalstacksh", slug("The local stack's state (`make up`, deploy/local/stack.sh)"))
	require.Equal(t, map[string]bool{"a": true, "a-1": true}, anchors("# A\n```\n# not a heading\n```\n## A\n"))
}
