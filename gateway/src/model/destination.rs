//! Where an endpoint's deliveries go: an HTTP URL (`kind: http`, the default), or a broker
//! (`redis-stream`, `nats`, `amqp`) at the endpoint's `url`, with the settings of
//! [`Destination`], or nowhere (`poll`: a consumer reads them). Stored in the endpoint's spec document; the password and token are
//! [`WriteOnly`].

use serde::{Deserialize, Serialize};

use super::egress::WriteOnly;

/// The kind of an endpoint's destination.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum EndpointKind {
    /// A webhook: an HTTP `POST` to the endpoint's URL.
    #[default]
    Http,
    /// `XADD` to a Redis stream (`redis://host:port[/db]`).
    RedisStream,
    /// A NATS JetStream publish, acknowledged (`nats://host:port`).
    Nats,
    /// An AMQP 0-9-1 publish with publisher confirms (`amqp://host:port[/vhost]`).
    Amqp,
    /// Pull delivery: nothing is sent; a consumer reads the deliveries with a cursor
    /// (`GET …/endpoints/{id}/poll`) and acknowledges them. No URL.
    Poll,
    /// A developer's `herald listen` (`listen://<name>`): the request is built here and
    /// goes down the listener's connection, which forwards it and posts the answer back.
    Listen,
}

impl EndpointKind {
    pub fn is_http(&self) -> bool {
        *self == EndpointKind::Http
    }

    /// Whether its deliveries wait to be read (`poll`) instead of being sent.
    pub fn is_pull(self) -> bool {
        self == EndpointKind::Poll
    }

    /// Whether it publishes to a broker (`redis-stream`, `nats`, `amqp`).
    pub fn is_broker(self) -> bool {
        matches!(self, EndpointKind::RedisStream | EndpointKind::Nats | EndpointKind::Amqp)
    }

    /// Whether its requests are HTTP requests (a webhook, or one a listener forwards).
    pub fn speaks_http(self) -> bool {
        matches!(self, EndpointKind::Http | EndpointKind::Listen)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            EndpointKind::Http => "http",
            EndpointKind::RedisStream => "redis-stream",
            EndpointKind::Nats => "nats",
            EndpointKind::Amqp => "amqp",
            EndpointKind::Poll => "poll",
            EndpointKind::Listen => "listen",
        }
    }

    /// The URL schemes an endpoint of this kind may use.
    pub fn schemes(self) -> &'static [&'static str] {
        match self {
            EndpointKind::Http => &["http", "https"],
            EndpointKind::RedisStream => &["redis", "rediss"],
            EndpointKind::Nats => &["nats", "tls"],
            EndpointKind::Amqp => &["amqp", "amqps"],
            EndpointKind::Poll => &[],
            EndpointKind::Listen => &["listen"],
        }
    }
}

/// A broker destination's settings. Templates take `{type}` (the event type) and
/// `{tenant}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Destination {
    /// Redis: the stream key template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<String>,
    /// Redis: `XADD … MAXLEN ~ n` (approximate trimming).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maxlen: Option<u64>,
    /// NATS: the subject template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    /// AMQP: the exchange (`""` is the default exchange).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exchange: Option<String>,
    /// AMQP: the routing key template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    /// Write-only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<WriteOnly>,
    /// NATS: an authentication token. Write-only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<WriteOnly>,
}

impl Destination {
    /// The template that names where a message goes for `kind`, if set.
    pub fn template(&self, kind: EndpointKind) -> Option<&str> {
        match kind {
            EndpointKind::Http | EndpointKind::Poll | EndpointKind::Listen => None,
            EndpointKind::RedisStream => self.stream.as_deref(),
            EndpointKind::Nats => self.subject.as_deref(),
            EndpointKind::Amqp => self.routing_key.as_deref(),
        }
    }
}

/// The placeholders a destination template may hold.
pub const TEMPLATE_PLACEHOLDERS: [&str; 2] = ["{type}", "{tenant}"];

/// `template` with `{type}` and `{tenant}` filled in.
pub fn render_template(template: &str, event_type: &str, tenant: &str) -> String {
    template.replace("{type}", event_type).replace("{tenant}", tenant)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_fill_both_placeholders() {
        assert_eq!(render_template("t.{tenant}.{type}", "order.paid", "acme"), "t.acme.order.paid");
        assert_eq!(render_template("fixed", "x", "y"), "fixed");
    }

    #[test]
    fn kind_is_kebab_case_and_http_by_default() {
        assert_eq!(serde_json::to_string(&EndpointKind::RedisStream).unwrap(), "\"redis-stream\"");
        assert_eq!(EndpointKind::default(), EndpointKind::Http);
    }
}
