//! How an endpoint's requests leave the node beyond the URL: an OAuth2 client-credentials
//! grant (`oauth2`), TLS client certificates and a private CA (`tls`), and the egress proxy
//! override (`proxy`). Stored in the endpoint's spec document. What is write-only (the
//! client secret, the client key; both sealed) is a [`WriteOnly`], whose `Debug` prints nothing.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A value the API takes and never shows: stored, used, never printed (`Debug` and every
/// API view leave it out).
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct WriteOnly(String);

impl WriteOnly {
    pub fn new(value: impl Into<String>) -> WriteOnly {
        WriteOnly(value.into())
    }
    /// The value, for the one place that uses it (a token request, the TLS handshake).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for WriteOnly {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

/// How the client authenticates to the token endpoint (RFC 6749 §2.3.1).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ClientAuth {
    /// HTTP Basic with the form-encoded client id and secret (the RFC's default).
    #[default]
    ClientSecretBasic,
    /// `client_id` and `client_secret` in the form body.
    ClientSecretPost,
}

/// OAuth2 client credentials (RFC 6749 §4.4): Herald fetches a token from `token_url` and
/// sends it as `Authorization: Bearer …`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OAuth2 {
    pub token_url: String,
    pub client_id: String,
    /// Sealed under the operator's `[secrets] key` when `client_secret_sealed`; one written
    /// on a node without a key (or before secrets were sealed) is as written, and is sealed
    /// at the endpoint's next write on a node with one.
    pub client_secret: WriteOnly,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub client_secret_sealed: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scopes: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audience: Option<String>,
    #[serde(default)]
    pub client_auth: ClientAuth,
}

/// TLS settings of an endpoint: a client certificate chain and its key (PEM; the key sealed
/// under the operator's `[secrets] key`), and CA certificates trusted for this endpoint
/// besides the public roots.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EndpointTls {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_cert: Option<String>,
    /// Sealed (`sign::seal`): never stored or shown in clear.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_key: Option<WriteOnly>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_bundle: Option<String>,
}
