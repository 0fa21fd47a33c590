package webhook_test

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/webhook"
)

// refused has one address of every block the guard refuses (address.go), each with the
// block's name.
var refused = map[string]string{
	"0.1.2.3":         "0.0.0.0/8",
	"10.1.2.3":        "10.0.0.0/8",
	"100.100.100.200": "100.64.0.0/10 (cloud metadata)",
	"100.64.0.1":      "100.64.0.0/10",
	"127.0.0.2":       "127.0.0.0/8",
	"169.254.169.254": "169.254.0.0/16",
	"172.16.5.4":      "172.16.0.0/12",
	"172.31.255.255":  "172.16.0.0/12",
	"192.0.0.8":       "192.0.0.0/24",
	"192.0.2.10":      "192.0.2.0/24",
	"192.88.99.1":     "192.88.99.0/24",
	"192.168.1.1":     "192.168.0.0/16",
	"198.18.0.1":      "198.18.0.0/15",
	"198.19.255.1":    "198.18.0.0/15",
	"198.51.100.7":    "198.51.100.0/24",
	"203.0.113.9":     "203.0.113.0/24",
	"224.0.0.251":     "224.0.0.0/4",
	"239.255.255.250": "224.0.0.0/4",
	"240.0.0.1":       "240.0.0.0/4",
	"255.255.255.255": "255.255.255.255/32",

	"::":                 "::/128",
	"::1":                "::1/128",
	"::ffff:10.0.0.1":    "::ffff:0:0/96 carrying 10.0.0.1",
	"::ffff:127.0.0.1":   "::ffff:0:0/96 carrying 127.0.0.1",
	"64:ff9b::a9fe:a9fe": "64:ff9b::/96 carrying 169.254.169.254",
	"64:ff9b::a00:1":     "64:ff9b::/96 carrying 10.0.0.1",
	"64:ff9b:1::808:808": "64:ff9b:1::/48",
	"100::1":             "100::/64",
	"2001::1":            "2001::/23 (Teredo)",
	"2001:1ff::1":        "2001::/23",
	"2001:db8::1":        "2001:db8::/32",
	"2002:a00:1::1":      "2002::/16 carrying 10.0.0.1",
	"2002:a9fe:a9fe::1":  "2002::/16 carrying 169.254.169.254",
	"3fff::1":            "3fff::/20",
	"5f00::1":            "5f00::/16",
	"fc00::1":            "fc00::/7",
	"fd12:3456::1":       "fc00::/7",
	"fe80::1":            "fe80::/10",
	"ff02::1":            "ff00::/8",
	"::7f00:1":           "::/3 (IPv4-compatible, deprecated)",
	"fec0::1":            "8000::/1 (site-local, deprecated)",
	"4000::1":            "4000::/2",
}

// public are globally reachable addresses, the edges of refused blocks among them.
var public = []string{
	"8.8.8.8", "93.184.215.14", "100.63.255.255", "100.128.0.1", "172.32.0.1", "192.0.1.1",
	"192.31.196.1", "198.20.0.1", "223.255.255.255",
	"2606:4700::1111", "2a00:1450:4001::1", "2001:200::1", "64:ff9b::808:808", "2002:808:808::1", "::ffff:8.8.8.8",
}

// urlOf is an endpoint URL with ip as its host.
func urlOf(ip string) string {
	host := ip
	if strings.Contains(ip, ":") {
		host = "[" + ip + "]"
	}
	return "http://" + host + ":9/hook"
}

// Every block of the table is refused when an endpoint names an address of it (CheckURL,
// at creation) and when a name resolves to it (the client's dialer, at every connection);
// public addresses, the blocks' neighbours included, pass.
func TestSpecialAddressesRefused(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	for ip, block := range refused {
		err := webhook.CheckURL(urlOf(ip), false)
		require.ErrorIs(t, err, webhook.ErrForbiddenTarget, "%s (%s) at creation", ip, block)
		require.Contains(t, err.Error(), "is not a public address")
		require.NoError(t, webhook.CheckURL(urlOf(ip), true), "%s with WEBHOOK_ALLOW_PRIVATE", ip)

		c := webhook.NewClient(webhook.Options{Timeout: 2 * time.Second, Resolver: resolverTo(t, netip.MustParseAddr(ip))})
		_, err = c.Post(ctx, "http://hooks.example.test:9/hook", http.Header{}, []byte(`{}`))
		require.ErrorIs(t, err, webhook.ErrForbiddenTarget, "%s (%s) when a name resolves to it", ip, block)
	}
	for _, ip := range public {
		require.NoError(t, webhook.CheckURL(urlOf(ip), false), ip)
		require.NoError(t, webhook.CheckAddress(net.JoinHostPort(ip, "443")), ip)
	}
}

// WEBHOOK_ALLOW_PRIVATE (Options.AllowPrivate) still reaches loopback through a name.
func TestAllowPrivateReachesLoopback(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	t.Cleanup(srv.Close)
	port := srv.URL[strings.LastIndex(srv.URL, ":")+1:]
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	loopback := resolverTo(t, netip.MustParseAddr("127.0.0.1"))

	_, err := webhook.NewClient(webhook.Options{Resolver: loopback}).Post(ctx, "http://hooks.example.test:"+port+"/", http.Header{}, []byte(`{}`))
	require.ErrorIs(t, err, webhook.ErrForbiddenTarget)
	r, err := webhook.NewClient(webhook.Options{Resolver: loopback, AllowPrivate: true}).Post(ctx, "http://hooks.example.test:"+port+"/", http.Header{}, []byte(`{}`))
	require.NoError(t, err)
	require.Equal(t, http.StatusNoContent, r.Status)
}

// resolverTo is a resolver whose DNS server, in the test, answers every name with ip: an A
// record for an IPv4 address, an AAAA record for an IPv6 one, no record of the other type.
func resolverTo(t *testing.T, ip netip.Addr) *net.Resolver {
	return &net.Resolver{PreferGo: true, Dial: func(context.Context, string, string) (net.Conn, error) {
		client, server := net.Pipe()
		go serveDNS(t, server, ip)
		return client, nil
	}}
}

// serveDNS answers the queries on conn, which carries DNS over a stream (two bytes of
// length before each message, RFC 1035 4.2.2), as net.Resolver sends on a conn that is not
// a net.PacketConn.
func serveDNS(t *testing.T, conn net.Conn, ip netip.Addr) {
	defer conn.Close()
	for {
		var n [2]byte
		if _, err := io.ReadFull(conn, n[:]); err != nil {
			return
		}
		q := make([]byte, binary.BigEndian.Uint16(n[:]))
		if _, err := io.ReadFull(conn, q); err != nil || len(q) < 12 {
			return
		}
		end := 12 // the question: its name's labels, a zero, then type and class
		for end < len(q) && q[end] != 0 {
			end += int(q[end]) + 1
		}
		end += 5
		if end > len(q) {
			return
		}
		qtype := binary.BigEndian.Uint16(q[end-4 : end-2])
		var rdata []byte
		switch {
		case qtype == 1 && ip.Is4(): // A
			a := ip.As4()
			rdata = a[:]
		case qtype == 28 && ip.Is6(): // AAAA
			a := ip.As16()
			rdata = a[:]
		}
		reply := append([]byte{}, q[:2]...)           // the query's id
		reply = append(reply, 0x81, 0x80, 0, 1, 0, 0) // a reply, recursion available; one question
		if rdata != nil {
			reply[7] = 1 // one answer
		}
		reply = append(reply, 0, 0, 0, 0) // no authority, no additional records
		reply = append(reply, q[12:end]...)
		if rdata != nil {
			reply = append(reply, 0xc0, 12) // the question's name
			reply = binary.BigEndian.AppendUint16(reply, qtype)
			reply = append(reply, 0, 1, 0, 0, 0, 60) // class IN, TTL 60 s
			reply = binary.BigEndian.AppendUint16(reply, uint16(len(rdata)))
			reply = append(reply, rdata...)
		}
		if _, err := conn.Write(binary.BigEndian.AppendUint16(nil, uint16(len(reply)))); err != nil {
			return
		}
		if _, err := conn.Write(reply); err != nil {
			t.Logf("dns reply: %v", err)
			return
		}
	}
}

// An endpoint's account filter names an existing account, when it is created and when it
// is changed; nothing is written otherwise.
func TestEndpointAccountMustExist(t *testing.T) {
	t.Parallel()
	b := setup(t)
	req := webhook.EndpointRequest{URL: "https://hooks.example.com/h", EventTypes: []string{webhook.EventThreshold}, Account: "nobody"}
	_, _, err := b.store.CreateEndpoint(b.ctx, req)
	require.ErrorIs(t, err, webhook.ErrUnknownAccount)
	eps, err := b.store.Endpoints(b.ctx)
	require.NoError(t, err)
	require.Empty(t, eps, "nothing written")

	b.org(t, "acme")
	req.Account = "acme"
	e, _, err := b.store.CreateEndpoint(b.ctx, req)
	require.NoError(t, err)
	require.Equal(t, "acme", e.Account)
	req.Account = "globex"
	_, err = b.store.UpdateEndpoint(b.ctx, e.ID, req)
	require.ErrorIs(t, err, webhook.ErrUnknownAccount)
	got, err := b.store.Endpoint(b.ctx, e.ID)
	require.NoError(t, err)
	require.Equal(t, "acme", got.Account, "the refused update changed nothing")
	req.Account = ""
	_, err = b.store.UpdateEndpoint(b.ctx, e.ID, req)
	require.NoError(t, err, "no filter is no account to check")

	req.Account = "a\x00b"
	_, _, err = b.store.CreateEndpoint(b.ctx, req)
	var inv *webhook.InvalidError
	require.ErrorAs(t, err, &inv, "not an id: bad input, not a database error")
	require.Equal(t, "account", inv.Field)
}
