// Command loadgen drives metergate's admit, or the redisrate peer, with POST requests for
// `make bench` and prints one JSON object on stdout: requests, answers per status, errors,
// the achieved rate and latency percentiles over the window after the warmup.
//
//	loadgen -url http://127.0.0.1:8080/v1/admit -token svc-… \
//	    -body '{"account":"{{item}}","units":{"requests":1}}' -items accounts.txt \
//	    -idempotency -concurrency 64 -warmup 2s -duration 10s [-rate 0] [-requests N]
//
// -rate 0 (the default) is closed loop: as fast as the workers go, to find the maximum.
// -rate N is open loop at N requests/s, latency measured from when each request was due;
// -concurrency then bounds the requests in flight, so give it room (rate × expected
// latency, with margin), and read "late" and "unsent" in the output. -requests N ends a
// closed loop after N requests (with -items of N lines: each item once).
//
// The body template is inline JSON or @file; {{item}} takes the next line of -items
// (round robin), {{idem}} a key unique to the request, {{seq}} the request number.
// -idempotency adds "idempotency_key":"{{idem}}" to a template that has none.
//
// It takes flags only: it is a tool that make bench drives, not a service to deploy.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/metergate/metergate/bench/internal/load"
)

func main() {
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil)).With("service", "loadgen")
	cfg, err := parse(os.Args[1:])
	if err != nil {
		log.Error("bad flags", "err", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg); err != nil {
		log.Error("loadgen failed", "err", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, cfg load.Config) error {
	res, err := load.Run(ctx, cfg)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(os.Stdout)
	if err := enc.Encode(res); err != nil {
		return fmt.Errorf("write result: %w", err)
	}
	return nil
}

func parse(args []string) (load.Config, error) {
	cfg := load.Config{}
	var body, itemsFile string
	var idempotency bool
	fs := flag.NewFlagSet("loadgen", flag.ContinueOnError)
	fs.StringVar(&cfg.URL, "url", "http://127.0.0.1:8080/v1/admit", "URL to POST to")
	fs.StringVar(&cfg.Token, "token", "", "bearer token sent with every request")
	fs.StringVar(&body, "body", `{}`, "JSON body template, inline or @file ({{item}}, {{idem}}, {{seq}})")
	fs.StringVar(&itemsFile, "items", "", "file of values for {{item}}, one per line (accounts, API keys)")
	fs.BoolVar(&idempotency, "idempotency", false, `add "idempotency_key":"{{idem}}" to a body template without {{idem}}`)
	fs.IntVar(&cfg.Concurrency, "concurrency", 64, "workers, and so the most requests in flight")
	fs.DurationVar(&cfg.Duration, "duration", 10*time.Second, "measured window")
	fs.DurationVar(&cfg.Warmup, "warmup", 2*time.Second, "load sent before the measured window, not counted")
	fs.Float64Var(&cfg.Rate, "rate", 0, "requests/s for an open loop; 0 is closed loop, as fast as possible")
	fs.Uint64Var(&cfg.Requests, "requests", 0, "closed loop: stop after this many requests, warmup included (0: no limit)")
	fs.DurationVar(&cfg.Timeout, "timeout", 10*time.Second, "per-request timeout (0: none)")
	fs.DurationVar(&cfg.LateAfter, "late-after", time.Millisecond, "open loop: a request sent later than this past its due time counts as late")
	if err := fs.Parse(args); err != nil {
		return load.Config{}, err
	}
	if fs.NArg() > 0 {
		return load.Config{}, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}

	if file, ok := strings.CutPrefix(body, "@"); ok {
		raw, err := os.ReadFile(file)
		if err != nil {
			return load.Config{}, fmt.Errorf("body: %w", err)
		}
		body = string(raw)
	}
	var items []string
	if itemsFile != "" {
		var err error
		if items, err = readLines(itemsFile); err != nil {
			return load.Config{}, fmt.Errorf("items: %w", err)
		}
	}
	tmpl, err := load.NewTemplate(body, items, idempotency)
	if err != nil {
		return load.Config{}, fmt.Errorf("body: %w", err)
	}
	cfg.Body = tmpl
	return cfg, cfg.Validate()
}

// readLines returns the non-blank lines of file, trimmed.
func readLines(file string) ([]string, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if line := strings.TrimSpace(sc.Text()); line != "" {
			lines = append(lines, line)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", file, err)
	}
	if len(lines) == 0 {
		return nil, errors.New(file + ": no values")
	}
	return lines, nil
}
