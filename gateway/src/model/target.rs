//! Where an endpoint's deliveries go, as a type: an HTTP `POST` ([`HttpTarget`]), one of
//! the brokers ([`RedisTarget`], [`NatsTarget`], [`AmqpTarget`]), a consumer's reads
//! ([`PollTarget`]: pull delivery, no URL), or a developer's `herald listen` connection
//! ([`ListenTarget`]), each with only its own settings. The stored document and the API
//! keep the flat form (`kind`, `url`,
//! `destination`, `oauth2`, `proxy`, `tls`); [`Target::from_flat`] reads it and refuses a
//! setting its kind does not take, [`Target::into_flat`] writes it back. Shape only: the
//! values are checked by `spec`.

use super::destination::{Destination, EndpointKind};
use super::egress::{EndpointTls, OAuth2, WriteOnly};

/// Where an endpoint's deliveries go.
#[derive(Debug, Clone, PartialEq)]
pub enum Target {
    Http(HttpTarget),
    RedisStream(RedisTarget),
    Nats(NatsTarget),
    Amqp(AmqpTarget),
    Poll(PollTarget),
    Listen(ListenTarget),
}

/// A `herald listen` connection (`listen://<name>`): the node builds and signs the request
/// as for a webhook and hands it to the listener connected for the endpoint, which forwards
/// it to the developer's local URL and posts the answer back.
#[derive(Debug, Clone, PartialEq)]
pub struct ListenTarget {
    pub url: String,
}

/// A webhook: an HTTP `POST` to `url`, and how the request leaves the node.
#[derive(Debug, Clone, PartialEq)]
pub struct HttpTarget {
    pub url: String,
    /// OAuth2 client credentials for the endpoint's requests.
    pub oauth2: Option<OAuth2>,
    /// The egress proxy for this endpoint: an `http://` CONNECT proxy URL, or `"none"`;
    /// absent: the node's `delivery.proxy`.
    pub proxy: Option<String>,
    /// TLS client certificate and private CA.
    pub tls: Option<EndpointTls>,
    /// The `User-Agent` its requests carry; `None`: Herald's (`herald/<version>`).
    pub user_agent: Option<String>,
    /// Nothing is delivered until the URL echoes a signed challenge (verified endpoints).
    pub verify: bool,
    /// `verify` was written on the endpoint itself, so it wins over the tenant's
    /// `verify_endpoints`; false: it follows the tenant's at its creation and URL changes.
    pub verify_explicit: bool,
}

/// `XADD` to a Redis stream (`redis://host:port[/db]`).
#[derive(Debug, Clone, PartialEq)]
pub struct RedisTarget {
    pub url: String,
    /// The stream key template.
    pub stream: String,
    /// `XADD … MAXLEN ~ n` (approximate trimming).
    pub maxlen: Option<u64>,
    pub username: Option<String>,
    /// Sealed.
    pub password: Option<WriteOnly>,
}

/// A NATS JetStream publish, acknowledged (`nats://host:port`).
#[derive(Debug, Clone, PartialEq)]
pub struct NatsTarget {
    pub url: String,
    /// The subject template.
    pub subject: String,
    pub username: Option<String>,
    /// Sealed.
    pub password: Option<WriteOnly>,
    /// An authentication token, instead of a username and password. Sealed.
    pub token: Option<WriteOnly>,
}

/// An AMQP 0-9-1 publish with publisher confirms (`amqp://host:port[/vhost]`).
#[derive(Debug, Clone, PartialEq)]
pub struct AmqpTarget {
    pub url: String,
    /// The exchange (`""`, or none: the default exchange).
    pub exchange: Option<String>,
    /// The routing key template.
    pub routing_key: String,
    pub username: Option<String>,
    /// Sealed.
    pub password: Option<WriteOnly>,
}

/// Pull delivery: nothing is sent; a consumer pages through the deliveries with a cursor
/// and acknowledges them (`api/poll.rs`). Its flat form has no URL (`""`) and no
/// destination; the worker never claims its deliveries (they are stored never due).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PollTarget {}

/// A flat setting that does not fit its kind: which field, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct ShapeError {
    pub field: &'static str,
    pub reason: String,
}

/// The HTTP-only settings of the flat form.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HttpSettings {
    pub oauth2: Option<OAuth2>,
    pub proxy: Option<String>,
    pub tls: Option<EndpointTls>,
    pub user_agent: Option<String>,
    pub verify: bool,
    /// See [`HttpTarget::verify_explicit`].
    pub verify_explicit: bool,
}

impl Target {
    /// An HTTP target at `url` with none of its own settings.
    pub fn http(url: impl Into<String>) -> Target {
        Target::Http(HttpTarget {
            url: url.into(),
            oauth2: None,
            proxy: None,
            tls: None,
            user_agent: None,
            verify: false,
            verify_explicit: false,
        })
    }

    pub fn kind(&self) -> EndpointKind {
        match self {
            Target::Http(_) => EndpointKind::Http,
            Target::RedisStream(_) => EndpointKind::RedisStream,
            Target::Nats(_) => EndpointKind::Nats,
            Target::Amqp(_) => EndpointKind::Amqp,
            Target::Poll(_) => EndpointKind::Poll,
            Target::Listen(_) => EndpointKind::Listen,
        }
    }

    /// The URL deliveries go to (a broker's, for a broker kind; none, `""`, for `poll`).
    pub fn url(&self) -> &str {
        match self {
            Target::Http(t) => &t.url,
            Target::RedisStream(t) => &t.url,
            Target::Nats(t) => &t.url,
            Target::Amqp(t) => &t.url,
            Target::Poll(_) => "",
            Target::Listen(t) => &t.url,
        }
    }

    /// The HTTP target, if it is one.
    pub fn as_http(&self) -> Option<&HttpTarget> {
        match self {
            Target::Http(t) => Some(t),
            _ => None,
        }
    }

    /// The target of the flat form: a broker kind needs its `destination` (with its
    /// template) and takes none of HTTP's settings; HTTP takes no `destination`; `poll`
    /// takes none of them, and no URL.
    pub fn from_flat(
        kind: EndpointKind,
        url: String,
        destination: Option<Destination>,
        http: HttpSettings,
    ) -> Result<Target, ShapeError> {
        if let (false, Some(field)) = (kind.is_http(), http.first_set()) {
            return Err(ShapeError { field, reason: format!("is for kind http only, not {}", kind.as_str()) });
        }
        if kind.is_pull() {
            return PollTarget::from_flat(url, destination).map(Target::Poll);
        }
        let Some(d) = destination else {
            return match kind {
                EndpointKind::Http => {
                    let HttpSettings { oauth2, proxy, tls, user_agent, verify, verify_explicit } = http;
                    Ok(Target::Http(HttpTarget { url, oauth2, proxy, tls, user_agent, verify, verify_explicit }))
                }
                EndpointKind::Listen => Ok(Target::Listen(ListenTarget { url })),
                _ => {
                    Err(ShapeError { field: "destination", reason: format!("is required for kind {}", kind.as_str()) })
                }
            };
        };
        match kind {
            EndpointKind::Http | EndpointKind::Listen => Err(ShapeError {
                field: "destination",
                reason: "is only for the kinds redis-stream, nats and amqp".into(),
            }),
            EndpointKind::RedisStream => RedisTarget::from_flat(url, d).map(Target::RedisStream),
            EndpointKind::Nats => NatsTarget::from_flat(url, d).map(Target::Nats),
            EndpointKind::Amqp => AmqpTarget::from_flat(url, d).map(Target::Amqp),
            EndpointKind::Poll => PollTarget::from_flat(url, Some(d)).map(Target::Poll),
        }
    }

    /// The flat form: kind, URL, a broker's destination, HTTP's settings.
    pub fn into_flat(self) -> (EndpointKind, String, Option<Destination>, HttpSettings) {
        let kind = self.kind();
        match self {
            Target::Http(HttpTarget { url, oauth2, proxy, tls, user_agent, verify, verify_explicit }) => {
                (kind, url, None, HttpSettings { oauth2, proxy, tls, user_agent, verify, verify_explicit })
            }
            Target::RedisStream(RedisTarget { url, stream, maxlen, username, password }) => {
                let d = Destination { stream: Some(stream), maxlen, username, password, ..Destination::default() };
                (kind, url, Some(d), HttpSettings::default())
            }
            Target::Nats(NatsTarget { url, subject, username, password, token }) => {
                let d = Destination { subject: Some(subject), username, password, token, ..Destination::default() };
                (kind, url, Some(d), HttpSettings::default())
            }
            Target::Amqp(AmqpTarget { url, exchange, routing_key, username, password }) => {
                let routing_key = Some(routing_key);
                let d = Destination { exchange, routing_key, username, password, ..Destination::default() };
                (kind, url, Some(d), HttpSettings::default())
            }
            Target::Poll(PollTarget {}) => (kind, String::new(), None, HttpSettings::default()),
            Target::Listen(ListenTarget { url }) => (kind, url, None, HttpSettings::default()),
        }
    }
}

/// Its kind's template, required.
fn required(field: &'static str, value: Option<String>) -> Result<String, ShapeError> {
    value.ok_or(ShapeError { field, reason: "required".into() })
}

/// The first of `fields` that is set, refused as not a setting of `kind`.
fn none_of(kind: &str, fields: [(&'static str, bool); 4]) -> Result<(), ShapeError> {
    match fields.into_iter().find(|(_, set)| *set) {
        Some((field, _)) => Err(ShapeError { field, reason: format!("is not a setting of kind {kind}") }),
        None => Ok(()),
    }
}

impl HttpSettings {
    /// The first of them that is set, by its field's name.
    fn first_set(&self) -> Option<&'static str> {
        let set = [
            ("oauth2", self.oauth2.is_some()),
            ("tls", self.tls.is_some()),
            ("proxy", self.proxy.is_some()),
            ("user_agent", self.user_agent.is_some()),
            ("verify", self.verify),
        ];
        set.into_iter().find(|(_, set)| *set).map(|(field, _)| field)
    }
}

impl PollTarget {
    /// No URL and no destination (HTTP's settings are refused with every other kind's).
    fn from_flat(url: String, d: Option<Destination>) -> Result<PollTarget, ShapeError> {
        if !url.is_empty() {
            let reason = "kind poll takes no URL: a consumer reads its deliveries (GET …/poll)".into();
            return Err(ShapeError { field: "url", reason });
        }
        match d {
            Some(_) => Err(ShapeError { field: "destination", reason: "is not a setting of kind poll".into() }),
            None => Ok(PollTarget {}),
        }
    }
}

impl RedisTarget {
    fn from_flat(url: String, d: Destination) -> Result<RedisTarget, ShapeError> {
        let Destination { stream, maxlen, subject, exchange, routing_key, username, password, token } = d;
        let stream = required("destination.stream", stream)?;
        none_of(
            "redis-stream",
            [
                ("destination.subject", subject.is_some()),
                ("destination.exchange", exchange.is_some()),
                ("destination.routing_key", routing_key.is_some()),
                ("destination.token", token.is_some()),
            ],
        )?;
        Ok(RedisTarget { url, stream, maxlen, username, password })
    }
}

impl NatsTarget {
    fn from_flat(url: String, d: Destination) -> Result<NatsTarget, ShapeError> {
        let Destination { stream, maxlen, subject, exchange, routing_key, username, password, token } = d;
        let subject = required("destination.subject", subject)?;
        none_of(
            "nats",
            [
                ("destination.stream", stream.is_some()),
                ("destination.maxlen", maxlen.is_some()),
                ("destination.exchange", exchange.is_some()),
                ("destination.routing_key", routing_key.is_some()),
            ],
        )?;
        Ok(NatsTarget { url, subject, username, password, token })
    }
}

impl AmqpTarget {
    fn from_flat(url: String, d: Destination) -> Result<AmqpTarget, ShapeError> {
        let Destination { stream, maxlen, subject, exchange, routing_key, username, password, token } = d;
        let routing_key = required("destination.routing_key", routing_key)?;
        none_of(
            "amqp",
            [
                ("destination.stream", stream.is_some()),
                ("destination.maxlen", maxlen.is_some()),
                ("destination.subject", subject.is_some()),
                ("destination.token", token.is_some()),
            ],
        )?;
        Ok(AmqpTarget { url, exchange, routing_key, username, password })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flat(kind: EndpointKind, d: Destination) -> Result<Target, ShapeError> {
        Target::from_flat(kind, "x://h".into(), Some(d), HttpSettings::default())
    }

    #[test]
    fn each_kind_takes_its_own_settings_and_round_trips() {
        let s = |v: &str| Some(v.to_string());
        let cases = [
            (EndpointKind::RedisStream, Destination { stream: s("s"), maxlen: Some(9), ..Default::default() }),
            (
                EndpointKind::Nats,
                Destination { subject: s("a.b"), token: Some(WriteOnly::new("t")), ..Default::default() },
            ),
            (EndpointKind::Amqp, Destination { exchange: s(""), routing_key: s("k"), ..Default::default() }),
        ];
        for (kind, d) in cases {
            let target = flat(kind, d.clone()).unwrap();
            assert_eq!(target.kind(), kind);
            assert_eq!(target.into_flat(), (kind, "x://h".into(), Some(d), HttpSettings::default()));
        }
    }

    #[test]
    fn a_setting_of_another_kind_is_refused_by_name() {
        let s = |v: &str| Some(v.to_string());
        let cases = [
            (
                EndpointKind::Nats,
                Destination { subject: s("a"), stream: s("s"), ..Default::default() },
                "destination.stream",
            ),
            (
                EndpointKind::RedisStream,
                Destination { stream: s("s"), token: Some(WriteOnly::new("t")), ..Default::default() },
                "destination.token",
            ),
            (
                EndpointKind::Amqp,
                Destination { routing_key: s("k"), maxlen: Some(1), ..Default::default() },
                "destination.maxlen",
            ),
            (EndpointKind::Amqp, Destination::default(), "destination.routing_key"),
        ];
        for (kind, d, field) in cases {
            assert_eq!(flat(kind, d).unwrap_err().field, field, "{kind:?}");
        }
        let proxied = HttpSettings { proxy: s("none"), ..Default::default() };
        let d = Destination { subject: s("a"), ..Default::default() };
        let err = Target::from_flat(EndpointKind::Nats, "x".into(), Some(d), proxied).unwrap_err();
        assert_eq!(err.to_string(), "proxy: is for kind http only, not nats");
        let err = Target::from_flat(EndpointKind::Amqp, "x".into(), None, HttpSettings::default()).unwrap_err();
        assert_eq!(err.to_string(), "destination: is required for kind amqp");
        let err = flat(EndpointKind::Http, Destination::default()).unwrap_err();
        assert_eq!(err.field, "destination");
    }

    #[test]
    fn poll_takes_no_url_destination_or_http_setting() {
        let poll = Target::from_flat(EndpointKind::Poll, String::new(), None, HttpSettings::default()).unwrap();
        assert_eq!(poll, Target::Poll(PollTarget {}));
        assert_eq!((poll.kind(), poll.url()), (EndpointKind::Poll, ""));
        assert_eq!(poll.into_flat(), (EndpointKind::Poll, String::new(), None, HttpSettings::default()));
        let url = Target::from_flat(EndpointKind::Poll, "https://h".into(), None, HttpSettings::default());
        assert_eq!(url.unwrap_err().field, "url");
        assert_eq!(flat(EndpointKind::Poll, Destination::default()).unwrap_err().field, "url");
        let d = Some(Destination::default());
        let err = Target::from_flat(EndpointKind::Poll, String::new(), d, HttpSettings::default()).unwrap_err();
        assert_eq!(err.to_string(), "destination: is not a setting of kind poll");
        let verify = HttpSettings { verify: true, ..Default::default() };
        let err = Target::from_flat(EndpointKind::Poll, String::new(), None, verify).unwrap_err();
        assert_eq!(err.to_string(), "verify: is for kind http only, not poll");
    }
}
