package tunnel

// ClientMetaKey is the frp login metadata key under which tether's client
// sends its version, shown in the server's /api/tunnels.
const ClientMetaKey = "tether_client"

// WebsocketPath is the HTTP path of the wss transport. It is frp's, so that a
// stock frpc with transport.protocol = "wss" connects unchanged.
const WebsocketPath = "/~!frp"
