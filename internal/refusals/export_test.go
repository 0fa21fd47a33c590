package refusals

import (
	"github.com/redis/go-redis/v9"

	"github.com/metergate/metergate/internal/keyspace"
)

// NewIdle is New without its writer: Refused queues until Start, so a test can fill the
// queue.
func NewIdle(rdb redis.UniversalClient, keys keyspace.Keys, o Options) *Log {
	return newLog(rdb, keys, o)
}

// Start starts the writer of a Log made by NewIdle.
func (l *Log) Start() { go l.run() }
