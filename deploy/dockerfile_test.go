package deploy_test

import (
	"os"
	"path"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// dockerfile is deploy/Dockerfile's instructions, continuation lines joined.
type dockerfile struct{ lines []string }

func parseDockerfile(src string) dockerfile {
	var d dockerfile
	cur := ""
	for _, line := range strings.Split(src, "\n") {
		t := strings.TrimSpace(line)
		if cur == "" && (t == "" || strings.HasPrefix(t, "#")) {
			continue
		}
		if strings.HasSuffix(t, "\\") {
			cur += strings.TrimSuffix(t, "\\") + " "
			continue
		}
		d.lines = append(d.lines, strings.Join(strings.Fields(cur+t), " "))
		cur = ""
	}
	return d
}

// stages splits the instructions by FROM.
func (d dockerfile) stages() [][]string {
	var out [][]string
	for _, l := range d.lines {
		if strings.HasPrefix(strings.ToUpper(l), "FROM ") {
			out = append(out, nil)
		}
		if len(out) > 0 {
			out[len(out)-1] = append(out[len(out)-1], l)
		}
	}
	return out
}

// goVersion is the Go the module needs: go.mod's toolchain line if any, else its go line.
func goVersion(gomod string) string {
	v := ""
	for _, line := range strings.Split(gomod, "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) == 2 && f[0] == "go" && v == "":
			v = f[1]
		case len(f) == 2 && f[0] == "toolchain":
			return strings.TrimPrefix(f[1], "go")
		}
	}
	return v
}

var (
	fromGolang = regexp.MustCompile(`(?i)^FROM (?:--platform=\S+ )?golang:([0-9][0-9.]*)(-\S+)? AS (\S+)$`)
	userLine   = regexp.MustCompile(`(?i)^USER ([0-9]+)(?::([0-9]+))?$`)
)

// checkDockerfile lists what is wrong with a Dockerfile for a module whose go.mod is gomod.
func checkDockerfile(src, gomod string) problems {
	var p problems
	stages := parseDockerfile(src).stages()
	if len(stages) < 2 {
		p.add("want a multi-stage build (a Go stage, then a runtime stage); have %d stage(s)", len(stages))
		return p
	}
	build, final := stages[0], stages[len(stages)-1]
	m := fromGolang.FindStringSubmatch(build[0])
	if m == nil {
		p.add("first stage %q: want FROM golang:<go.mod's version> AS <name>", build[0])
		return p
	}
	// The official images set GOTOOLCHAIN=local: an older Go than go.mod's refuses to build;
	// a floating tag (golang:1.26) builds with whatever patch release is current.
	if want := goVersion(gomod); m[1] != want {
		p.add("FROM golang:%s: want golang:%s, go.mod's version", m[1], want)
	}
	buildName := m[3]
	run := strings.Join(build, "\n")
	if !strings.Contains(run, "CGO_ENABLED=0") {
		p.add("the build stage does not set CGO_ENABLED=0: the binaries would not be static")
	}
	for _, cmd := range []string{"./cmd/admit", "./cmd/meter", "./cmd/reconcile"} {
		if !strings.Contains(run, cmd) {
			p.add("the build stage does not build %s", cmd)
		}
	}

	from := strings.Fields(final[0])
	if image := from[len(from)-1]; !strings.HasPrefix(image, "gcr.io/distroless/static") || !strings.HasSuffix(image, ":nonroot") {
		p.add("runtime stage %q: want gcr.io/distroless/static…:nonroot (static binaries need no libc; no shell)", final[0])
	}
	user, copied := "", ""
	for _, l := range final[1:] {
		if u := userLine.FindStringSubmatch(l); u != nil {
			user = u[1]
		} else if strings.HasPrefix(strings.ToUpper(l), "USER ") {
			user = "non-numeric"
		}
		if strings.HasPrefix(l, "COPY --from="+buildName+" ") {
			copied += " " + strings.TrimPrefix(l, "COPY --from="+buildName+" ")
		}
	}
	// Kubernetes can check runAsNonRoot against a numeric USER only.
	if user == "" || user == "0" || user == "non-numeric" {
		p.add("runtime stage: want USER <numeric uid other than 0>, have %q", user)
	}
	f := strings.Fields(copied)
	if len(f) < 2 || f[len(f)-1] != "/" {
		p.add("runtime stage: want the binaries copied to / (the manifests run /admit, /meter, /reconcile); have COPY%s", copied)
	} else {
		for _, bin := range []string{"admit", "meter", "reconcile"} {
			found := false
			for _, src := range f[:len(f)-1] {
				found = found || path.Base(src) == bin
			}
			if !found {
				p.add("runtime stage: %s is not copied from the build stage", bin)
			}
		}
	}
	return p
}

// checkDockerignore lists the files the build needs that an ignore file leaves out.
func checkDockerignore(ignore string) problems {
	var p problems
	var patterns []string
	for _, line := range strings.Split(ignore, "\n") {
		if t := strings.TrimSpace(line); t != "" && !strings.HasPrefix(t, "#") && !strings.HasPrefix(t, "!") {
			patterns = append(patterns, strings.TrimPrefix(t, "/"))
		}
	}
	for _, need := range []string{"go.mod", "go.sum", "cmd/admit/main.go", "internal/config/load.go", "pkg/event/event.go", "internal/api/openapi.yaml", "lua/admit.lua", "lua/lua.go", "migrations/00001_dead_letters.sql", "migrations/migrations.go"} {
		for _, pat := range patterns {
			if excludes(pat, need) {
				p.add("ignore pattern %q leaves out %s, which the build needs", pat, need)
			}
		}
	}
	for _, heavy := range []string{".git", ".cache", ".run", "bin"} {
		found := false
		for _, pat := range patterns {
			found = found || pat == heavy
		}
		if !found {
			p.add("the ignore file does not leave out %s", heavy)
		}
	}
	return p
}

// excludes reports whether an ignore pattern leaves out name: it matches name or one of its
// parent folders, a leading **/ at any depth (enough of Docker's rules for these files).
func excludes(pat, name string) bool {
	for ; name != "." && name != "/"; name = path.Dir(name) {
		if ok, _ := path.Match(pat, name); ok {
			return true
		}
		if rest, ok := strings.CutPrefix(pat, "**/"); ok {
			segs := strings.Split(name, "/")
			for i := range segs {
				if ok, _ := path.Match(rest, strings.Join(segs[i:], "/")); ok {
					return true
				}
			}
		}
	}
	return false
}

// deploy/Dockerfile builds static binaries with go.mod's Go into a non-root image.
func TestDockerfile(t *testing.T) {
	src, err := os.ReadFile("Dockerfile")
	require.NoError(t, err)
	gomod, err := os.ReadFile("../go.mod")
	require.NoError(t, err)
	p := checkDockerfile(string(src), string(gomod))
	require.Empty(t, p, "deploy/Dockerfile:\n%s", strings.Join(p, "\n"))

	ignore, err := os.ReadFile("Dockerfile.dockerignore")
	require.NoError(t, err)
	p = checkDockerignore(string(ignore))
	require.Empty(t, p, "deploy/Dockerfile.dockerignore:\n%s", strings.Join(p, "\n"))

	for _, tc := range []struct{ name, old, new, want string }{
		{"floating go", "golang:" + goVersion(string(gomod)) + " AS", "golang:1.26 AS", "want golang:" + goVersion(string(gomod))},
		{"older go", "golang:" + goVersion(string(gomod)) + " AS", "golang:1.25.3 AS", "want golang:"},
		{"cgo", "CGO_ENABLED=0 ", "", "CGO_ENABLED=0"},
		{"one binary left out", " ./cmd/meter", "", "does not build ./cmd/meter"},
		{"root user", "USER 65532:65532", "USER 0", "numeric uid"},
		{"named user", "USER 65532:65532", "USER nonroot:nonroot", "numeric uid"},
		{"no user", "USER 65532:65532\n", "", "numeric uid"},
		{"shell image", "gcr.io/distroless/static-debian12:nonroot", "debian:12", "distroless"},
		{"binary not copied", " /out/reconcile /", " /", "reconcile is not copied"},
		{"wrong folder", "/out/reconcile /", "/out/reconcile /bin/", "copied to /"},
	} {
		mutated := strings.Replace(string(src), tc.old, tc.new, 1)
		require.NotEqual(t, string(src), mutated, "%s: the mutation no longer applies", tc.name)
		p := checkDockerfile(mutated, string(gomod))
		require.True(t, containsProblem(p, tc.want), "%s: want a problem containing %q, got %q", tc.name, tc.want, p)
	}
	for _, tc := range []struct{ name, add, want string }{
		{"internal ignored", "internal\n", "leaves out internal/config"},
		{"pkg ignored", "pkg\n", "leaves out pkg/event"},
		{"sql ignored", "**/*.sql\n", "leaves out migrations/00001"},
		{"yaml ignored", "*.yaml\n", ""},
	} {
		p := checkDockerignore(string(ignore) + tc.add)
		if tc.want == "" { // a top-level *.yaml leaves internal/api/openapi.yaml in: no problem
			require.Empty(t, p, tc.name)
			continue
		}
		require.True(t, containsProblem(p, tc.want), "%s: want a problem containing %q, got %q", tc.name, tc.want, p)
	}
	require.True(t, containsProblem(checkDockerignore(strings.Replace(string(ignore), ".cache\n", "", 1)), "does not leave out .cache"))
}

func containsProblem(p problems, want string) bool {
	for _, s := range p {
		if strings.Contains(s, want) {
			return true
		}
	}
	return false
}
