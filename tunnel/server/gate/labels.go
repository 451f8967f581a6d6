package gate

// Reasons for refusing a client's stream and closing its session (label
// values of tether_streams_refused_total).
const (
	// StreamMalformed: the stream's first message could not be read.
	StreamMalformed = "malformed"
	// StreamTooLarge: the stream's first message is larger than frp reads.
	StreamTooLarge = "too_large"
	// StreamSecondLogin: a second login on a connection.
	StreamSecondLogin = "second_login"
	// StreamForeignWorkConn: a work connection for another run ID, or
	// before login.
	StreamForeignWorkConn = "foreign_work_conn"
	// StreamMessageType: a first message that opens no stream frp serves.
	StreamMessageType = "message_type"
)

// The label values of what the gate tells its Observer, every one of them,
// so that the host can export each at 0 before its first event: an alert on
// a rise then sees the first.

// Limits returns every limit SessionLimited names.
func Limits() []string {
	return []string{
		LimitLoginBudget, LimitStreamBeforeLogin, LimitStreams, LimitPings, LimitNoLogin,
		LimitLoginTimeout, LimitFirstByte, LimitEvicted,
	}
}

// Refusals returns every reason ConnectionRefused names.
func Refusals() []string {
	return []string{RefusedAnonymous, RefusedAnonymousPerIP, RefusedAnonymousPerSubnet}
}

// StreamRefusals returns every reason StreamRefused names.
func StreamRefusals() []string {
	return []string{StreamMalformed, StreamTooLarge, StreamSecondLogin, StreamForeignWorkConn, StreamMessageType}
}
