//! The HTTP client the OTLP span exporter posts through (`telemetry`): Herald's own hyper
//! and rustls, so no second HTTP stack (reqwest) is linked. The exporter's batch thread is
//! not a runtime thread, so each request runs as a task on the node's runtime and the
//! exporter awaits its handle. The collector is the operator's: no SSRF guard, no proxy.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use opentelemetry_http::{HttpClient, HttpError, Request, Response};

/// The most of a collector's answer read (it is only ever a short status document).
const MAX_ANSWER: usize = 64 * 1024;

type HttpsClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

/// An OTLP/HTTP client on `runtime`, each request bounded by `timeout`.
#[derive(Clone)]
pub struct OtlpClient {
    client: HttpsClient,
    runtime: tokio::runtime::Handle,
    timeout: Duration,
}

impl std::fmt::Debug for OtlpClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OtlpClient").field("timeout", &self.timeout).finish_non_exhaustive()
    }
}

impl OtlpClient {
    pub fn new(runtime: tokio::runtime::Handle, timeout: Duration) -> OtlpClient {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(timeout));
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_webpki_roots(Arc::new(rustls::crypto::ring::default_provider()))
            .expect("ring provider supports the default protocol versions")
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new()).pool_idle_timeout(Duration::from_secs(60)).build(https);
        OtlpClient { client, runtime, timeout }
    }
}

#[async_trait::async_trait]
impl HttpClient for OtlpClient {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let (client, timeout) = (self.client.clone(), self.timeout);
        let (parts, body) = request.into_parts();
        let request = Request::from_parts(parts, Full::new(body));
        let exchange = async move {
            let response = client.request(request).await?;
            let (parts, body) = response.into_parts();
            let body = Limited::new(body, MAX_ANSWER).collect().await?.to_bytes();
            Ok::<_, HttpError>(Response::from_parts(parts, body))
        };
        let task = self.runtime.spawn(async move {
            tokio::time::timeout(timeout, exchange).await.map_err(|_| HttpError::from("OTLP export timed out"))?
        });
        task.await?
    }
}
