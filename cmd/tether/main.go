// Command tether is the reverse-tunnel server, client and tools:
//
//	tether server    the platform's tunnel server
//	tether client    the tunnel client in a customer's cluster
//	tether diagnose  where the client's path to the server breaks, step by step
//	tether status    a server's connected tunnels, or a client's connection
//	tether token     keys and tokens
//	tether demo      everything on loopback, with stand-in backends
//	tether version
//
// Exit codes: see exitCodesHelp, which `tether --help` prints.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

// The exit codes, the same for every command.
const (
	exitOK    = 0
	exitFail  = 1
	exitUsage = 2
)

// exitCodesHelp documents the exit codes, in `tether --help` and in the
// operations guide (docs/operations.md), which quotes it.
const exitCodesHelp = `Exit codes:
  0  success (tether server: also after a drain on SIGTERM)
  1  failed: could not start, stopped on an error, or (tether diagnose) a check failed
  2  invalid invocation: an unknown command or flag, or a wrong flag, environment
     variable, config file key or value; fix the invocation, do not retry it`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], &Factory{Out: os.Stdout, ErrOut: os.Stderr, LookupEnv: os.LookupEnv}, runners{})
	stop()
	os.Exit(code)
}

// run executes one command line and returns the exit code. Errors are printed
// here, once.
func run(ctx context.Context, args []string, f *Factory, r runners) int {
	root := newCmdRoot(f, r)
	root.SetArgs(args)
	root.SetOut(f.Out)
	root.SetErr(f.ErrOut)
	err := root.ExecuteContext(ctx)
	f.Close()
	if err == nil {
		return exitOK
	}
	var usage *usageError
	if errors.As(err, &usage) {
		fmt.Fprintf(f.ErrOut, "tether: %v\n", err)
		if usage.hint != "" {
			fmt.Fprintln(f.ErrOut, usage.hint)
		}
		return exitUsage
	}
	fmt.Fprintf(f.ErrOut, "tether: %v\n", err)
	return exitFail
}

// usageError is a mistake in how tether was invoked or configured (exit 2).
type usageError struct {
	err  error
	hint string
}

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }
