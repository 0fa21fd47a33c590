package cli_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/cli"
)

func TestDispatch(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		args     []string
		code     int
		ran      string   // the command run, "" for none
		ranWith  []string // its arguments
		usage    bool     // the list of commands was printed
		contains string   // more that stderr must hold
	}{
		"no arguments: the default":        {args: nil, ran: "run", ranWith: []string{}},
		"a flag first: the default":        {args: []string{"-json", "-dry-run"}, ran: "run", ranWith: []string{"-json", "-dry-run"}},
		"a command with its flags":         {args: []string{"verify", "-json"}, ran: "verify", ranWith: []string{"-json"}},
		"the default by name":              {args: []string{"run"}, ran: "run", ranWith: []string{}},
		"the command's exit code":          {args: []string{"fail"}, code: 1, ran: "fail", ranWith: []string{}},
		"help lists the commands":          {args: []string{"help"}, usage: true},
		"help of a command is its -h":      {args: []string{"help", "verify"}, ran: "verify", ranWith: []string{"-h"}},
		"-h: the list, then the default's": {args: []string{"-h"}, ran: "run", ranWith: []string{"-h"}, usage: true},
		"--help as -h":                     {args: []string{"--help"}, ran: "run", ranWith: []string{"--help"}, usage: true},
		"an unknown command: exit 2": {args: []string{"verfy", "-json"}, code: 2, usage: true,
			contains: `reconcile: unknown command "verfy"`},
		"help of an unknown command": {args: []string{"help", "verfy"}, code: 2, usage: true,
			contains: `unknown command "verfy"`},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var ran string
			var ranWith []string
			cmd := func(name string, code int) cli.Command {
				return cli.Command{Name: name, Summary: "does " + name, Run: func(args []string) int {
					ran, ranWith = name, args
					return code
				}}
			}
			var stderr strings.Builder
			code := cli.Dispatch("reconcile", tc.args, &stderr, cmd("run", 0), cmd("verify", 0), cmd("fail", 1))
			require.Equal(t, tc.code, code)
			require.Equal(t, tc.ran, ran)
			if tc.ran != "" {
				require.Equal(t, tc.ranWith, append([]string{}, ranWith...))
			}
			if tc.usage {
				require.Contains(t, stderr.String(), "Usage: reconcile [command] [flags]")
				require.Regexp(t, `(?m)^  run +does run \(the default\)$`, stderr.String())
				require.Regexp(t, `(?m)^  verify +does verify$`, stderr.String())
			} else {
				require.Empty(t, stderr.String())
			}
			require.Contains(t, stderr.String(), tc.contains)
		})
	}
}
