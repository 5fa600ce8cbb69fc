//! Which hosts and ports a sandboxed worker may reach: `HOST[:PORT]` entries, a host being a
//! name (`pypi.org`), a wildcard over a name's subdomains (`*.example.org`) or an IP literal
//! (`10.0.0.5`, `[::1]`); no port means 443 and 80.

use std::net::IpAddr;

/// Ports an entry without one allows.
pub const DEFAULT_PORTS: [u16; 2] = [443, 80];

/// An entry of an allowlist that could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("--allow-net {entry:?}: {problem}")]
pub struct AllowlistError {
    /// The entry as given.
    pub entry: String,
    /// What is wrong with it, and what it takes.
    pub problem: String,
}

/// What an entry names.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Host {
    /// This name exactly (lower case, no trailing dot).
    Name(String),
    /// Any name ending in `.suffix` (not `suffix` itself).
    Subdomains(String),
    /// This address.
    Address(IpAddr),
}

/// One entry: a host and the ports it allows.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Entry {
    host: Host,
    ports: Vec<u16>,
}

/// The hosts a worker may reach. Empty: none.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Allowlist {
    entries: Vec<Entry>,
}

/// Why a destination is refused before any address is looked up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The name is not listed (on this port, or at all).
    NotListed,
    /// The name is listed, for other ports.
    PortNotListed {
        /// The ports listed for it.
        listed: Vec<u16>,
    },
    /// An IP literal that is not listed as such.
    AddressNotListed,
    /// The name resolves to an address in a loopback, link-local or private range (or to none
    /// routable), which only an entry for that address allows.
    PrivateAddress(IpAddr),
    /// The name does not resolve.
    Unresolved(String),
    /// Not a host name (empty, too long, characters no name has).
    BadName,
}

impl Refusal {
    /// The sentence said to the cell (and the audit trail): what was refused and how to allow it.
    pub fn explain(&self, host: &str, port: u16) -> String {
        let allow = if port == 443 || port == 80 {
            format!("--allow-net {host}")
        } else {
            format!("--allow-net {host}:{port}")
        };
        match self {
            Refusal::NotListed => format!(
                "the host refused {host}:{port}: it is not in the egress allowlist ({allow} or Sandbox::allow_net allows it)"
            ),
            Refusal::PortNotListed { listed } => format!(
                "the host refused {host}:{port}: {host} is allowed on port{} {} only ({allow} allows this one)",
                if listed.len() == 1 { "" } else { "s" },
                listed
                    .iter()
                    .map(u16::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Refusal::AddressNotListed => format!(
                "the host refused {host}:{port}: an address, not a listed name ({allow} allows it)"
            ),
            Refusal::PrivateAddress(address) => format!(
                "the host refused {host}:{port}: it resolves to {address}, a loopback, link-local or private address (--allow-net {address} allows it)"
            ),
            Refusal::Unresolved(why) => {
                format!("the host refused {host}:{port}: the name does not resolve ({why})")
            }
            Refusal::BadName => format!("the host refused {host:?}: not a host name"),
        }
    }
}

/// The longest name DNS has.
const MAX_NAME: usize = 253;

/// `host` as a name (lower case, no trailing dot), if it is one.
fn name(host: &str) -> Option<String> {
    let host = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
    let fits = !host.is_empty()
        && host.len() <= MAX_NAME
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        });
    fits.then_some(host)
}

/// `host` as an IP literal (`10.0.0.5`, `::1`, `[::1]`).
fn address(host: &str) -> Option<IpAddr> {
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    bare.parse().ok()
}

impl std::str::FromStr for Allowlist {
    type Err = AllowlistError;

    /// `HOST[:PORT],...` as `--allow-net` takes it.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::parse(text.split(',').map(str::trim).filter(|e| !e.is_empty()))
    }
}

impl Allowlist {
    /// Reads entries (`pypi.org`, `*.example.org:8443`, `10.0.0.5:5432`, `[::1]:8080`).
    pub fn parse<'a>(entries: impl IntoIterator<Item = &'a str>) -> Result<Self, AllowlistError> {
        let mut list = Allowlist::default();
        for entry in entries {
            list.entries.push(Self::entry(entry)?);
        }
        Ok(list)
    }

    fn entry(text: &str) -> Result<Entry, AllowlistError> {
        let fail = |problem: &str| AllowlistError {
            entry: text.to_owned(),
            problem: problem.to_owned(),
        };
        // `[v6]:port`, `[v6]`, `host:port`, `host`; a bare v6 address has colons of its own.
        let (host, port) = if let Some(rest) = text.strip_prefix('[') {
            let (inside, after) = rest
                .split_once(']')
                .ok_or_else(|| fail("an IPv6 address in brackets needs its closing `]`"))?;
            let port = match after {
                "" => None,
                _ => Some(
                    after
                        .strip_prefix(':')
                        .ok_or_else(|| fail("after `]` comes `:PORT` or nothing"))?,
                ),
            };
            (inside, port)
        } else if text.matches(':').count() > 1 {
            (text, None)
        } else {
            match text.split_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (text, None),
            }
        };
        let ports = match port {
            None => DEFAULT_PORTS.to_vec(),
            Some(port) => match port.parse::<u16>() {
                Ok(0) | Err(_) => return Err(fail("the port is a number from 1 to 65535")),
                Ok(port) => vec![port],
            },
        };
        let host = if let Some(ip) = address(host) {
            Host::Address(ip)
        } else if let Some(suffix) = host.strip_prefix("*.") {
            Host::Subdomains(
                name(suffix)
                    .ok_or_else(|| fail("a wildcard is `*.` before a name (`*.example.org`)"))?,
            )
        } else {
            Host::Name(name(host).ok_or_else(|| {
                fail("a host is a name (`pypi.org`), `*.` and a name, or an IP address")
            })?)
        };
        Ok(Entry { host, ports })
    }

    /// Whether nothing is listed.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entries as `--allow-net` takes them back.
    pub fn entries(&self) -> Vec<String> {
        self.entries
            .iter()
            .flat_map(|e| {
                let host = match &e.host {
                    Host::Name(n) => n.clone(),
                    Host::Subdomains(s) => format!("*.{s}"),
                    Host::Address(IpAddr::V6(a)) => format!("[{a}]"),
                    Host::Address(a) => a.to_string(),
                };
                if e.ports == DEFAULT_PORTS {
                    vec![host]
                } else {
                    e.ports.iter().map(|p| format!("{host}:{p}")).collect()
                }
            })
            .collect()
    }

    /// Whether `host` (a name or an IP literal) may be reached on `port`, as far as the list
    /// says before any lookup: `Ok(true)` for a listed address (connected as it is), `Ok(false)`
    /// for a listed name (to be resolved and checked with [`allows_address`](Self::allows_address)).
    pub fn check(&self, host: &str, port: u16) -> Result<bool, Refusal> {
        if let Some(ip) = address(host) {
            let listed = self
                .entries
                .iter()
                .any(|e| e.host == Host::Address(ip) && e.ports.contains(&port));
            return if listed {
                Ok(true)
            } else {
                Err(Refusal::AddressNotListed)
            };
        }
        let Some(host) = name(host) else {
            return Err(Refusal::BadName);
        };
        let matching: Vec<&Entry> = self
            .entries
            .iter()
            .filter(|e| match &e.host {
                Host::Name(n) => *n == host,
                Host::Subdomains(s) => host
                    .strip_suffix(s.as_str())
                    .is_some_and(|rest| rest.ends_with('.')),
                Host::Address(_) => false,
            })
            .collect();
        if matching.iter().any(|e| e.ports.contains(&port)) {
            return Ok(false);
        }
        if matching.is_empty() {
            return Err(Refusal::NotListed);
        }
        let mut listed: Vec<u16> = matching.iter().flat_map(|e| e.ports.clone()).collect();
        listed.sort_unstable();
        listed.dedup();
        Err(Refusal::PortNotListed { listed })
    }

    /// Whether an address a listed name resolved to may be connected to: a public one, or one
    /// listed as an address (on `port`).
    pub fn allows_address(&self, ip: IpAddr, port: u16) -> bool {
        public(ip)
            || self
                .entries
                .iter()
                .any(|e| e.host == Host::Address(ip) && e.ports.contains(&port))
    }
}

/// Whether `ip` is routable on the internet: not loopback, link-local (cloud metadata lives at
/// 169.254.169.254), private, shared (carrier NAT), unspecified, multicast, broadcast or
/// documentation space, nor an IPv6 address that maps or embeds one of those.
pub fn public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            !(v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_multicast()
                || v4.is_documentation()
                || a == 0
                || (a == 100 && (64..128).contains(&b))
                || (a == 192 && b == 0)
                || (a == 198 && (18..20).contains(&b))
                || a >= 240)
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return public(IpAddr::V4(v4));
            }
            let first = v6.segments()[0];
            !(v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (first & 0xfe00) == 0xfc00
                || (first & 0xffc0) == 0xfe80
                || first == 0x2001 && v6.segments()[1] == 0x0db8
                || first == 0x0064 && v6.segments()[1] == 0xff9b)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_read_and_said_back() {
        let list: Allowlist = "PyPI.org, *.pythonhosted.org:443,10.0.0.5:5432,[::1]:8080,::2"
            .parse()
            .unwrap();
        assert_eq!(
            list.entries(),
            [
                "pypi.org",
                "*.pythonhosted.org:443",
                "10.0.0.5:5432",
                "[::1]:8080",
                "[::2]"
            ]
        );
        for bad in [
            "*.",
            "a..b",
            "host:0",
            "host:99999",
            "host:x",
            "[::1",
            "[::1]x",
            "a b",
            "*",
        ] {
            let error = Allowlist::parse([bad]).unwrap_err();
            assert_eq!(error.entry, bad);
            assert!(error.to_string().starts_with("--allow-net"), "{error}");
        }
    }

    #[test]
    fn names_ports_and_wildcards_are_matched() {
        let list: Allowlist = "pypi.org,*.example.org:8443,10.0.0.5:5432".parse().unwrap();
        assert_eq!(list.check("pypi.org", 443), Ok(false));
        assert_eq!(list.check("PYPI.ORG.", 80), Ok(false));
        assert_eq!(
            list.check("pypi.org", 22),
            Err(Refusal::PortNotListed {
                listed: vec![80, 443]
            })
        );
        assert_eq!(list.check("files.pypi.org", 443), Err(Refusal::NotListed));
        assert_eq!(list.check("a.example.org", 8443), Ok(false));
        assert_eq!(list.check("a.b.example.org", 8443), Ok(false));
        assert_eq!(list.check("example.org", 8443), Err(Refusal::NotListed));
        assert_eq!(list.check("badexample.org", 8443), Err(Refusal::NotListed));
        assert_eq!(list.check("10.0.0.5", 5432), Ok(true));
        assert_eq!(list.check("10.0.0.6", 5432), Err(Refusal::AddressNotListed));
        assert_eq!(list.check("[::1]", 443), Err(Refusal::AddressNotListed));
        assert_eq!(list.check("ex ample", 443), Err(Refusal::BadName));
        assert!(Allowlist::default().check("pypi.org", 443).is_err());
        let said = Refusal::NotListed.explain("evil.test", 443);
        assert!(said.contains("--allow-net evil.test"), "{said}");
        let said = Refusal::NotListed.explain("evil.test", 8080);
        assert!(said.contains("--allow-net evil.test:8080"), "{said}");
    }

    #[test]
    fn private_addresses_need_an_entry_of_their_own() {
        let list: Allowlist = "internal.test,127.0.0.2:8080".parse().unwrap();
        for ip in [
            "127.0.0.1",
            "169.254.169.254",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "100.64.0.1",
            "0.0.0.0",
            "::1",
            "fe80::1",
            "fd00::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            assert!(!list.allows_address(ip, 443), "{ip}");
        }
        assert!(list.allows_address("127.0.0.2".parse().unwrap(), 8080));
        assert!(!list.allows_address("127.0.0.2".parse().unwrap(), 443));
        assert!(list.allows_address("151.101.0.223".parse().unwrap(), 443));
        assert!(list.allows_address("2a04:4e42::223".parse().unwrap(), 443));
    }
}
