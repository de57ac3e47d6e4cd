//! Pure network policy shared by the API's validation, the plugin host and `deliver`:
//! which addresses webhooks may never reach (the SSRF table) and which headers belong to
//! the HTTP layer or to Herald. No I/O.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

pub mod headers;
pub mod proxy;

/// Is `ip` an address webhooks must never reach unless private destinations are allowed?
/// The one judge of every address (literal in a URL or resolved): anything in IANA's IPv4
/// and IPv6 special-purpose registries that is not globally reachable, plus documentation
/// and benchmarking ranges and multicast. IPv6 forms that embed or translate an IPv4
/// address (mapped, compatible, NAT64, 6to4) are judged by that address; Teredo and
/// ORCHID-style tunnels, whose real target is hidden, are refused outright.
pub fn is_forbidden(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_forbidden_v4(v4),
        IpAddr::V6(v6) => match embedded_v4(v6) {
            Some(v4) => is_forbidden_v4(v4),
            None => is_forbidden_v6(v6),
        },
    }
}

/// IANA IPv4 special-purpose registry (every entry not globally reachable), multicast,
/// reserved and broadcast.
fn is_forbidden_v4(v4: Ipv4Addr) -> bool {
    let [a, b, c, _] = v4.octets();
    a == 0                                        // 0.0.0.0/8 "this network"
        || a == 10                                // 10/8 private
        || (a == 100 && (64..128).contains(&b))   // 100.64/10 shared (CGNAT)
        || a == 127                               // loopback
        || (a == 169 && b == 254)                 // link-local, cloud metadata
        || (a == 172 && (16..32).contains(&b))    // 172.16/12 private
        || (a == 192 && b == 0 && c == 0)         // 192.0.0/24 IETF protocol assignments
        || (a == 192 && b == 0 && c == 2)         // TEST-NET-1
        || (a == 192 && b == 31 && c == 196)      // AS112-v4
        || (a == 192 && b == 52 && c == 193)      // AMT
        || (a == 192 && b == 88 && c == 99)       // deprecated 6to4 relay anycast
        || (a == 192 && b == 168)                 // 192.168/16 private
        || (a == 192 && b == 175 && c == 48)      // direct delegation AS112
        || (a == 198 && (b & 0xfe) == 18)         // 198.18/15 benchmarking
        || (a == 198 && b == 51 && c == 100)      // TEST-NET-2
        || (a == 203 && b == 0 && c == 113)       // TEST-NET-3
        || a >= 224 // multicast 224/4, reserved 240/4, broadcast
}

/// The IPv4 address an IPv6 address stands for, when it is a translation or embedding:
/// IPv4-mapped `::ffff:0:0/96`, IPv4-compatible `::/96` (beyond `::` and `::1`), NAT64
/// `64:ff9b::/96` and `64:ff9b:1::/48` (RFC 6052 /48 layout), 6to4 `2002::/16`.
fn embedded_v4(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = v6.segments();
    let o = v6.octets();
    let tail = Ipv4Addr::new(o[12], o[13], o[14], o[15]);
    match s {
        [0, 0, 0, 0, 0, 0xffff, _, _] => Some(tail),
        [0, 0, 0, 0, 0, 0, hi, _] if hi != 0 => Some(tail),
        [0x64, 0xff9b, 0, 0, 0, 0, _, _] => Some(tail),
        // RFC 6052 /48: the IPv4 address sits in bits 48..64 and 72..88 (bits 64..72 are u).
        // Local-use, but still a translation: the address it reaches decides.
        [0x64, 0xff9b, 1, ..] => Some(Ipv4Addr::new(o[6], o[7], o[9], o[10])),
        [0x2002, ..] => Some(Ipv4Addr::new(o[2], o[3], o[4], o[5])),
        _ => None,
    }
}

/// IANA IPv6 special-purpose registry (every entry not globally reachable), plus tunnels
/// whose real destination Herald cannot judge, multicast and site-local.
fn is_forbidden_v6(v6: Ipv6Addr) -> bool {
    let s = v6.segments();
    v6.is_unspecified()                            // ::
        || v6.is_loopback()                        // ::1
        || s[0] == 0                               // rest of ::/16 (incl. ::ffff:0:0:0/96 SIIT)
        || (s[0] == 0x0100 && s[1..4] == [0, 0, 0]) // 100::/64 discard-only
        || (s[0] == 0x2001 && s[1] < 0x0200)       // 2001::/23 IETF protocol assignments (Teredo, benchmarking, ORCHID)
        || (s[0] == 0x2001 && s[1] == 0x0db8)      // 2001:db8::/32 documentation
        || (s[0] == 0x3fff && s[1] < 0x1000)        // 3fff::/20 documentation
        || s[0] == 0x5f00                          // 5f00::/16 SRv6 SIDs
        || (s[0] & 0xfe00) == 0xfc00               // fc00::/7 unique-local
        || (s[0] & 0xffc0) == 0xfe80               // fe80::/10 link-local
        || (s[0] & 0xffc0) == 0xfec0               // fec0::/10 site-local (deprecated)
        || (s[0] & 0xff00) == 0xff00 // ff00::/8 multicast
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every range of IANA's IPv4 and IPv6 special-purpose registries, the embedded and
    /// translated IPv6 forms, and public addresses that must stay reachable.
    #[test]
    #[rustfmt::skip]
    fn ssrf_guard_table() {
        let cases = [
            // address                      forbidden  why
            ("0.0.0.0",                     true),  // this host
            ("0.1.2.3",                     true),  // this network 0/8
            ("10.1.2.3",                    true),  // private
            ("100.64.0.1",                  true),  // shared address space (CGNAT)
            ("100.127.255.254",             true),
            ("100.128.0.1",                 false), // just past CGNAT
            ("127.0.0.1",                   true),  // loopback
            ("127.255.255.254",             true),
            ("169.254.169.254",             true),  // link-local, cloud metadata
            ("172.16.0.1",                  true),  // private
            ("172.31.255.255",              true),
            ("172.32.0.1",                  false),
            ("192.0.0.8",                   true),  // IETF protocol assignments
            ("192.0.0.170",                 true),  // NAT64/DNS64 discovery
            ("192.0.2.10",                  true),  // TEST-NET-1
            ("192.31.196.1",                true),  // AS112-v4
            ("192.52.193.1",                true),  // AMT
            ("192.88.99.1",                 true),  // deprecated 6to4 relay anycast
            ("192.168.1.1",                 true),  // private
            ("192.175.48.1",                true),  // direct delegation AS112
            ("198.18.0.1",                  true),  // benchmarking 198.18/15
            ("198.19.255.255",              true),
            ("198.20.0.1",                  false),
            ("198.51.100.7",                true),  // TEST-NET-2
            ("203.0.113.9",                 true),  // TEST-NET-3
            ("224.0.0.1",                   true),  // multicast
            ("239.255.255.250",             true),
            ("240.0.0.1",                   true),  // reserved
            ("255.255.255.255",             true),  // limited broadcast
            ("8.8.8.8",                     false),
            ("1.1.1.1",                     false),
            ("93.184.215.14",               false),
            ("::",                          true),  // unspecified
            ("::1",                         true),  // loopback
            ("::ffff:127.0.0.1",            true),  // IPv4-mapped
            ("::ffff:10.0.0.1",             true),
            ("::ffff:8.8.8.8",              false), // mapped public: judged as 8.8.8.8
            ("::127.0.0.1",                 true),  // IPv4-compatible
            ("::169.254.169.254",           true),
            ("::8.8.8.8",                   false),
            ("::ffff:0:7f00:1",             true),  // IPv4-translated (SIIT)
            ("64:ff9b::7f00:1",             true),  // NAT64 well-known prefix
            ("64:ff9b::a9fe:a9fe",          true),
            ("64:ff9b::808:808",            false), // NAT64 of 8.8.8.8
            ("64:ff9b:1:7f00:1::",          true),  // local-use NAT64 /48: 127.0.0.1
            ("64:ff9b:1:a00:0:100::",       true),  // 10.0.0.1 (bits 64..72 skipped)
            ("64:ff9b:1:808:8:800::",       false), // 8.8.8.8
            ("100::1",                      true),  // discard-only
            ("2001::1",                     true),  // Teredo
            ("2001:0:4136:e378:8000:63bf:3fff:fdd2", true),
            ("2001:1::1",                   true),  // port control anycast
            ("2001:2::1",                   true),  // benchmarking
            ("2001:3::1",                   true),  // AMT
            ("2001:4:112::1",               true),  // AS112-v6
            ("2001:10::1",                  true),  // ORCHID
            ("2001:20::1",                  true),  // ORCHIDv2
            ("2001:db8::1",                 true),  // documentation
            ("2002:7f00:1::1",              true),  // 6to4 of 127.0.0.1
            ("2002:a9fe:a9fe::1",           true),  // 6to4 of 169.254.169.254
            ("2002:c000:204::1",            true),  // 6to4 of 192.0.2.4
            ("2002:808:808::1",             false), // 6to4 of 8.8.8.8
            ("3fff::1",                     true),  // documentation 3fff::/20
            ("3fff:fff::1",                 true),
            ("5f00::1",                     true),  // SRv6 SIDs
            ("fc00::1",                     true),  // unique-local
            ("fd00::1",                     true),
            ("fe80::1",                     true),  // link-local
            ("febf::1",                     true),
            ("fec0::1",                     true),  // site-local
            ("feff::1",                     true),
            ("ff02::1",                     true),  // multicast
            ("ff0e::1",                     true),
            ("2606:4700::1111",             false),
            ("2a00:1450:4001::200e",        false),
            ("2001:200::1",                 false), // past 2001::/23
            ("3fff:1000::1",                false), // past 3fff::/20
        ];
        for (ip, want) in cases {
            assert_eq!(is_forbidden(ip.parse().unwrap()), want, "{ip}");
        }
    }
}
