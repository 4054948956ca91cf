//! The unique id of a rendezvous at a known address, as NCCL makes it from `NCCL_COMM_ID`
//! (`bootstrapGetUniqueId`, NCCL 2.28): its bootstrap handle, `{ uint64_t magic; union
//! ncclSocketAddress addr; }`, holds NCCL's fixed magic and the address parsed as
//! `ncclSocketGetAddrFromString` parses it, the rest of the 128 bytes zero. Built here, the
//! ranks that only connect need no variable set, and rank 0 needs one only for its init call.

use std::ffi::CString;
use std::net::{Ipv6Addr, SocketAddr, ToSocketAddrs};

use nix::libc;

/// `NCCL_MAGIC`, the handle's magic when the id comes from an address.
const NCCL_MAGIC: u64 = 0x0280_0280_0280_0280;

/// Where the socket address starts in the handle: after the 8-byte magic (the union's
/// alignment is 4).
const ADDRESS_OFFSET: usize = 8;

/// The id's bytes for `address`, or what is wrong with it.
pub(super) fn handle_bytes(address: &str) -> Result<[u8; 128], String> {
    let socket = parse(address)?;
    let mut bytes = [0_u8; 128];
    bytes[..ADDRESS_OFFSET].copy_from_slice(&NCCL_MAGIC.to_ne_bytes());
    let sockaddr = &mut bytes[ADDRESS_OFFSET..];
    match socket {
        Socket::V4 { octets, port } => {
            // struct sockaddr_in: family (host order), port (network order), address; zero after.
            sockaddr[0..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
            sockaddr[2..4].copy_from_slice(&port.to_be_bytes());
            sockaddr[4..8].copy_from_slice(&octets);
        }
        Socket::V6 {
            octets,
            port,
            scope_id,
        } => {
            // struct sockaddr_in6: family, port, flow info (0), address, scope id.
            sockaddr[0..2].copy_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
            sockaddr[2..4].copy_from_slice(&port.to_be_bytes());
            sockaddr[8..24].copy_from_slice(&octets);
            sockaddr[24..28].copy_from_slice(&scope_id.to_ne_bytes());
        }
    }
    Ok(bytes)
}

/// A parsed socket address, as NCCL stores it.
#[derive(Debug, PartialEq, Eq)]
enum Socket {
    V4 {
        octets: [u8; 4],
        port: u16,
    },
    V6 {
        octets: [u8; 16],
        port: u16,
        scope_id: u32,
    },
}

fn parse_port(text: &str) -> Result<u16, String> {
    text.parse::<u16>()
        .map_err(|_| format!("{text:?} is not a port number (0 to 65535)"))
}

/// `[ipv6]:port` or `[ipv6%interface]:port` (a link-local address's interface), else
/// `host:port`, resolved with the system's resolver and its first answer, as NCCL does.
fn parse(address: &str) -> Result<Socket, String> {
    if let Some(bracketed) = address.strip_prefix('[') {
        let (inside, port) = bracketed
            .split_once("]:")
            .ok_or_else(|| "an IPv6 address is written [address]:port".to_owned())?;
        let port = parse_port(port)?;
        let (ip, interface) = match inside.split_once('%') {
            Some((ip, interface)) => (ip, Some(interface)),
            None => (inside, None),
        };
        let ip: Ipv6Addr = ip
            .parse()
            .map_err(|_| format!("{ip:?} is not an IPv6 address"))?;
        let scope_id = match interface {
            None => 0,
            Some(name) => interface_index(name)?,
        };
        return Ok(Socket::V6 {
            octets: ip.octets(),
            port,
            scope_id,
        });
    }
    let (host, port) = address
        .split_once(':')
        .ok_or_else(|| "no port is given".to_owned())?;
    if port.contains(':') {
        return Err("an IPv6 address is written [address]:port".to_owned());
    }
    if host.is_empty() {
        return Err("no host is given".to_owned());
    }
    let port = parse_port(port)?;
    let first = (host, port)
        .to_socket_addrs()
        .map_err(|error| format!("cannot resolve {host:?}: {error}"))?
        .next()
        .ok_or_else(|| format!("{host:?} resolves to no address"))?;
    Ok(match first {
        SocketAddr::V4(socket) => Socket::V4 {
            octets: socket.ip().octets(),
            port,
        },
        // NCCL keeps neither the flow information nor the scope of a resolved IPv6 address.
        SocketAddr::V6(socket) => Socket::V6 {
            octets: socket.ip().octets(),
            port,
            scope_id: 0,
        },
    })
}

/// The index of network interface `name`, for a link-local address's scope.
fn interface_index(name: &str) -> Result<u32, String> {
    let unknown = || format!("{name:?} is not a network interface of this host");
    let name_c = CString::new(name).map_err(|_| unknown())?;
    // SAFETY: a NUL-terminated string that lives across the call; the call only reads it.
    let index = unsafe { libc::if_nametoindex(name_c.as_ptr()) };
    if index == 0 {
        return Err(unknown());
    }
    Ok(index)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn magic() -> [u8; 8] {
        NCCL_MAGIC.to_ne_bytes()
    }

    #[test]
    fn an_ipv4_address_is_the_handle_ncclgetuniqueid_makes() {
        let bytes = handle_bytes("127.0.0.1:29501").unwrap();
        assert_eq!(bytes[..8], magic());
        // AF_INET (2) in host order, port 29501 = 0x733d in network order, 127.0.0.1.
        assert_eq!(bytes[8..16], [2, 0, 0x73, 0x3d, 127, 0, 0, 1]);
        assert!(bytes[16..].iter().all(|&byte| byte == 0));
    }

    #[test]
    fn an_ipv6_address_is_bracketed() {
        let bytes = handle_bytes("[::1]:40000").unwrap();
        assert_eq!(bytes[..8], magic());
        // AF_INET6 (10), port 40000 = 0x9c40, flow information 0.
        assert_eq!(bytes[8..16], [10, 0, 0x9c, 0x40, 0, 0, 0, 0]);
        let mut loopback = [0_u8; 16];
        loopback[15] = 1;
        assert_eq!(bytes[16..32], loopback);
        assert!(bytes[32..].iter().all(|&byte| byte == 0), "scope id 0");
    }

    #[test]
    fn a_host_name_is_resolved() {
        let bytes = handle_bytes("localhost:29501").unwrap();
        let v4 = handle_bytes("127.0.0.1:29501").unwrap();
        let v6 = handle_bytes("[::1]:29501").unwrap();
        assert!(bytes == v4 || bytes == v6);
    }

    #[test]
    fn an_address_that_says_nowhere_is_refused_saying_why() {
        for (address, why) in [
            ("", "no port"),
            ("10.0.0.7", "no port"),
            (":29501", "no host"),
            ("10.0.0.7:x", "\"x\" is not a port number"),
            ("10.0.0.7:70000", "\"70000\" is not a port number"),
            ("fe80::1:29501", "[address]:port"),
            ("[::1]29501", "[address]:port"),
            ("[zz::1]:1", "\"zz::1\" is not an IPv6 address"),
            (
                "[fe80::1%no-such-interface]:1",
                "is not a network interface",
            ),
            (
                "no-such-host.invalid:1",
                "cannot resolve \"no-such-host.invalid\"",
            ),
        ] {
            let error = handle_bytes(address).unwrap_err();
            assert!(error.contains(why), "{address:?}: {error}");
        }
    }
}
