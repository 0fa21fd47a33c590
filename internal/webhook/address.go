package webhook

import (
	"fmt"
	"net/netip"
)

// specialBlock is an address block a webhook may not reach, or whose addresses embed an
// IPv4 address that decides (embedded not nil).
type specialBlock struct {
	prefix   netip.Prefix
	name     string // what the registry calls it, and the RFC
	embedded func(netip.Addr) netip.Addr
}

// special is the one table of the address guard: every block of the IANA IPv4 and IPv6
// Special-Purpose Address Registries that is not globally reachable, with the multicast
// blocks, and the IPv6 space outside 2000::/3 (nothing there is allocated for global
// unicast, IANA IPv6 Address Space registry). The longest prefix that holds an address
// decides for it. Three IPv6 blocks carry an IPv4 address, which is checked instead:
// IPv4-mapped, the NAT64 well-known prefix and 6to4 (64:ff9b::a9fe:a9fe reaches
// 169.254.169.254 through a NAT64 gateway). Globally reachable entries of the registries
// inside a refused block (192.0.0.9/32, 2001:1::1/128, 2001:4:112::/48, ...) are refused
// with it: a webhook receiver does not live on an anycast service address.
//
//	https://www.iana.org/assignments/iana-ipv4-special-registry/
//	https://www.iana.org/assignments/iana-ipv6-special-registry/
//	https://www.iana.org/assignments/ipv6-address-space/
var special = []specialBlock{
	{prefix: netip.MustParsePrefix("0.0.0.0/8"), name: `"this network", RFC 791`},
	{prefix: netip.MustParsePrefix("10.0.0.0/8"), name: "private-use, RFC 1918"},
	{prefix: netip.MustParsePrefix("100.64.0.0/10"), name: "shared address space (carrier-grade NAT, cloud metadata), RFC 6598"},
	{prefix: netip.MustParsePrefix("127.0.0.0/8"), name: "loopback, RFC 1122"},
	{prefix: netip.MustParsePrefix("169.254.0.0/16"), name: "link-local (cloud metadata), RFC 3927"},
	{prefix: netip.MustParsePrefix("172.16.0.0/12"), name: "private-use, RFC 1918"},
	{prefix: netip.MustParsePrefix("192.0.0.0/24"), name: "IETF protocol assignments, RFC 6890"},
	{prefix: netip.MustParsePrefix("192.0.2.0/24"), name: "documentation (TEST-NET-1), RFC 5737"},
	{prefix: netip.MustParsePrefix("192.88.99.0/24"), name: "6to4 relay anycast (deprecated), RFC 7526"},
	{prefix: netip.MustParsePrefix("192.168.0.0/16"), name: "private-use, RFC 1918"},
	{prefix: netip.MustParsePrefix("198.18.0.0/15"), name: "benchmarking, RFC 2544"},
	{prefix: netip.MustParsePrefix("198.51.100.0/24"), name: "documentation (TEST-NET-2), RFC 5737"},
	{prefix: netip.MustParsePrefix("203.0.113.0/24"), name: "documentation (TEST-NET-3), RFC 5737"},
	{prefix: netip.MustParsePrefix("224.0.0.0/4"), name: "multicast, RFC 5771"},
	{prefix: netip.MustParsePrefix("240.0.0.0/4"), name: "reserved, RFC 1112"},
	{prefix: netip.MustParsePrefix("255.255.255.255/32"), name: "limited broadcast, RFC 919"},

	{prefix: netip.MustParsePrefix("::/128"), name: "unspecified, RFC 4291"},
	{prefix: netip.MustParsePrefix("::1/128"), name: "loopback, RFC 4291"},
	{prefix: netip.MustParsePrefix("::ffff:0:0/96"), name: "IPv4-mapped, RFC 4291", embedded: lastFour},
	{prefix: netip.MustParsePrefix("64:ff9b::/96"), name: "IPv4-IPv6 translation (NAT64), RFC 6052", embedded: lastFour},
	{prefix: netip.MustParsePrefix("64:ff9b:1::/48"), name: "local-use IPv4-IPv6 translation, RFC 8215"},
	{prefix: netip.MustParsePrefix("100::/64"), name: "discard-only, RFC 6666"},
	{prefix: netip.MustParsePrefix("2001::/23"), name: "IETF protocol assignments, RFC 2928"},
	{prefix: netip.MustParsePrefix("2001:db8::/32"), name: "documentation, RFC 3849"},
	{prefix: netip.MustParsePrefix("2002::/16"), name: "6to4, RFC 3056", embedded: sixToFour},
	{prefix: netip.MustParsePrefix("3fff::/20"), name: "documentation, RFC 9637"},
	{prefix: netip.MustParsePrefix("5f00::/16"), name: "segment routing (SRv6) SIDs, RFC 9602"},
	{prefix: netip.MustParsePrefix("fc00::/7"), name: "unique-local, RFC 4193"},
	{prefix: netip.MustParsePrefix("fe80::/10"), name: "link-local unicast, RFC 4291"},
	{prefix: netip.MustParsePrefix("ff00::/8"), name: "multicast, RFC 4291"},
	{prefix: netip.MustParsePrefix("::/3"), name: "not global unicast (outside 2000::/3), RFC 4291"},
	{prefix: netip.MustParsePrefix("4000::/2"), name: "not global unicast (outside 2000::/3), RFC 4291"},
	{prefix: netip.MustParsePrefix("8000::/1"), name: "not global unicast (outside 2000::/3), RFC 4291"},
}

// lastFour is the IPv4 address in the last 32 bits of an IPv6 address.
func lastFour(ip netip.Addr) netip.Addr {
	b := ip.As16()
	return netip.AddrFrom4([4]byte(b[12:16]))
}

// sixToFour is the IPv4 address of a 6to4 address, 2002:AABB:CCDD::/48.
func sixToFour(ip netip.Addr) netip.Addr {
	b := ip.As16()
	return netip.AddrFrom4([4]byte(b[2:6]))
}

// checkIP refuses (ErrForbiddenTarget) an address of a block of special, or one that
// embeds such an IPv4 address.
func checkIP(ip netip.Addr) error {
	ip = ip.WithZone("")
	var block *specialBlock
	for i := range special {
		b := &special[i]
		if b.prefix.Contains(ip) && (block == nil || b.prefix.Bits() > block.prefix.Bits()) {
			block = b
		}
	}
	switch {
	case block == nil:
		return nil
	case block.embedded != nil:
		v4 := block.embedded(ip)
		if err := checkIP(v4); err != nil {
			return fmt.Errorf("%w: %s is not a public address (%s, %s, carries %s)", ErrForbiddenTarget, ip, block.prefix, block.name, v4)
		}
		return nil
	}
	return fmt.Errorf("%w: %s is not a public address (%s, %s)", ErrForbiddenTarget, ip, block.prefix, block.name)
}

// checkAddress refuses an "ip:port" that checkIP refuses, or that is not one.
func checkAddress(address string) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("%w: %q: %w", ErrForbiddenTarget, address, err)
	}
	return checkIP(ap.Addr())
}
