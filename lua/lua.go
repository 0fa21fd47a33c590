// Package lua embeds metergate's Redis scripts and exposes them as ready *redis.Script
// values (EVALSHA, falling back to EVAL when the server has not cached the script yet).
package lua

import (
	"embed"

	"github.com/redis/go-redis/v9"
)

//go:embed *.lua
var files embed.FS

func mustScript(name string) *redis.Script {
	src, err := files.ReadFile(name)
	if err != nil {
		panic("lua: missing embedded script " + name) // a build defect, caught by every test
	}
	return redis.NewScript(string(src))
}

// Adjust applies one correction to one or more counters exactly once, guarded by a marker
// key written in the same script (see adjust.lua for keys, arguments and reply).
var Adjust = mustScript("adjust.lua")
