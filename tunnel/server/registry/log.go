package registry

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// BridgeRedisLog routes go-redis's own log lines into log (as the child
// logger "redis"), at debug.
//
// go-redis logs through one process-wide logger, to stderr by default, and
// during an outage it logs every failed dial; the registry already logs an
// outage once, at Warn, so these lines are detail. main calls this once;
// go-redis never logs passwords.
func BridgeRedisLog(log *zap.Logger) {
	redis.SetLogger(redisLogger{log.Named("redis")})
}

type redisLogger struct{ log *zap.Logger }

func (l redisLogger) Printf(_ context.Context, format string, v ...any) {
	if l.log.Core().Enabled(zap.DebugLevel) {
		l.log.Debug(fmt.Sprintf(format, v...))
	}
}
