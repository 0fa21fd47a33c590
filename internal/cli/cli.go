// Package cli dispatches a binary's subcommands: the first argument names one, the arguments
// after it are its own. Flags and environment variables are not its business: each command
// reads them with internal/config.
package cli

import (
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
)

// Command is one subcommand of a binary.
type Command struct {
	Name    string // the first argument that picks it
	Summary string // one line for the list of commands
	// Run runs the command with the arguments after its name and returns the exit code.
	Run func(args []string) int
}

// Main runs the command args picks (see Dispatch) and exits with its code.
func Main(binary string, args []string, cmds ...Command) {
	os.Exit(Dispatch(binary, args, os.Stderr, cmds...))
}

// Dispatch runs the command named by args[0] with the rest of args and returns its exit code.
// The first of cmds is the default: it runs with all of args when they are empty or start
// with a flag. "help" lists the commands (exit 0); "help <command>" is "<command> -h". -h
// lists them too, then runs the default with -h for its flags. Any other first argument is
// an unknown command: the list, and exit 2.
func Dispatch(binary string, args []string, stderr io.Writer, cmds ...Command) int {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help") {
			usage(binary, stderr, cmds)
		}
		return cmds[0].Run(args)
	}
	name, rest := args[0], args[1:]
	if name == "help" {
		if len(rest) == 0 {
			usage(binary, stderr, cmds)
			return 0
		}
		name, rest = rest[0], []string{"-h"}
	}
	for _, c := range cmds {
		if c.Name == name {
			return c.Run(rest)
		}
	}
	fmt.Fprintf(stderr, "%s: unknown command %q\n\n", binary, name)
	usage(binary, stderr, cmds)
	return 2
}

func usage(binary string, w io.Writer, cmds []Command) {
	fmt.Fprintf(w, "Usage: %s [command] [flags]\n\nCommands:\n", binary)
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	for i, c := range cmds {
		summary := c.Summary
		if i == 0 {
			summary += " (the default)"
		}
		fmt.Fprintf(tw, "  %s\t%s\n", c.Name, summary)
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "\nRun '%s help <command>' for a command's flags.\n", binary)
}
