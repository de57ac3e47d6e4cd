//! The partition's verification gate (verified endpoints): an HTTP endpoint that asks for
//! verification (`verify`) gets nothing until its current URL has echoed a signed random
//! challenge. Only the partition lease holder sends the handshake, before a claim; what it
//! got is stored (`Admin::put_verification`), so every node sharing the store reads the
//! same state. While the gate is closed the partition claims nothing and takes nothing at
//! intake: the deliveries wait in the store, as a paused endpoint's do, until their TTL.
//! What counts as an echo and the backoff of the tries are `model::verification`'s.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use rand::Rng;

use super::super::known::Known;
use super::super::target::{Opened, Transport};
use super::Partition;
use crate::classify::Outcome;
use crate::deliver::Outgoing;
use crate::model::{Endpoint, Gate, Millis, VERIFICATION_TYPE, Verification, judge_answer, new_id, rfc3339};
use crate::sign::{self, Secret};

impl Partition {
    /// The gate before a claim of `endpoint` at `now`: `None` when it is open (sending a
    /// handshake first if one is due); otherwise when to look again. A closed gate hands
    /// back whatever was taken at intake, due now (so turning `verify` off or a
    /// verification lets it go at once), and closes the partition to intake.
    pub(super) async fn unverified(&mut self, endpoint: &mut Endpoint, now: Millis) -> Option<Millis> {
        let at = match endpoint.verify_gate(now) {
            Gate::Open => return None,
            Gate::WaitUntil(at) => at,
            Gate::Due => {
                let v = self.handshake(endpoint, now).await;
                self.note_verification(endpoint, v.clone()).await;
                v.next_try_at?
            }
        };
        // Nothing goes out on the settings of before (a URL changed since).
        self.target = None;
        self.queue.extend(self.signal.known(Known::take_inbox));
        self.release_queue(now).await;
        Some(at)
    }

    /// Stores what a handshake got, and keeps it with the endpoint as read.
    async fn note_verification(&mut self, endpoint: &mut Endpoint, v: Verification) {
        tracing::info!(
            endpoint_id = %self.id, state = ?v.state, reason = v.reason.as_deref().unwrap_or(""),
            next_try_at = v.next_try_at.map(rfc3339).unwrap_or_default(), "endpoint verification"
        );
        if let Err(e) = self.inner.store.put_verification(&self.id, &v).await {
            // Tried again at the next refill that reads it unverified.
            tracing::warn!(endpoint_id = %self.id, error = %e, "cannot store the endpoint's verification");
        }
        if let Some(read) = self.endpoint.as_mut() {
            read.verification = Some(v.clone());
        }
        endpoint.verification = Some(v);
    }

    /// Sends the verification request to `endpoint`'s URL and judges the answer.
    async fn handshake(&mut self, endpoint: &Endpoint, now: Millis) -> Verification {
        let url = endpoint.spec.target.url().to_string();
        let stored = endpoint.verification.as_ref();
        let delivery = &self.inner.config.delivery;
        let opened = match Opened::open(endpoint, delivery, self.inner.config.secrets.as_deref(), now) {
            Ok(o) => o,
            Err(e) => return Verification::failed(stored, &url, e.hold_reason(), now),
        };
        let challenge = URL_SAFE_NO_PAD.encode(self.rng.random::<[u8; 32]>());
        let msg_id = new_id("vrf", now, &mut self.rng);
        let out = match request(&opened, endpoint, &msg_id, &challenge, now) {
            Some(out) => out,
            // Not an HTTP endpoint: nothing to verify.
            None => return Verification::verified(&url, now),
        };
        let deliverer = &self.inner.attempts.deliverer;
        let outcome = match &opened.transport {
            Transport::Http { auth: Some(auth), .. } => deliverer.send_authorized(out, auth).await.outcome,
            _ => Ok(deliverer.send(out).await),
        };
        let judged = match outcome {
            Ok(Outcome::Response(r)) => judge_answer(r.status, &r.body_prefix, &challenge),
            Ok(Outcome::Transport { kind, detail }) => Err(format!("no answer ({}): {detail}", kind.as_str())),
            Err(e) => Err(format!("oauth2: no token: {e}")),
        };
        match judged {
            Ok(()) => Verification::verified(&url, now),
            Err(reason) => Verification::failed(stored, &url, reason, now),
        }
    }
}

/// The verification request: a `POST` of `{"type": "webhook.verification", "challenge":
/// …}` to the endpoint's URL along its route, signed as a delivery is (Standard Webhooks'
/// headers, every valid key), with `msg_id` as its `webhook-id`. `None` for a broker.
fn request(opened: &Opened, endpoint: &Endpoint, msg_id: &str, challenge: &str, now: Millis) -> Option<Outgoing> {
    let Transport::Http { url, route, user_agent, .. } = &opened.transport else { return None };
    let body = serde_json::json!({
        "type": VERIFICATION_TYPE,
        "challenge": challenge,
        "endpoint_id": endpoint.id.as_str(),
        "timestamp": rfc3339(now),
    })
    .to_string();
    let timestamp = now.div_euclid(1000);
    let secrets: Vec<&Secret> = opened.secrets.iter().collect();
    let keys: Vec<_> = opened.signing_keys.iter().collect();
    let signature = sign::signature_header(&secrets, &keys, msg_id, timestamp, body.as_bytes());
    let agent = user_agent.clone().unwrap_or_else(|| concat!("herald/", env!("CARGO_PKG_VERSION")).to_string());
    let headers = vec![
        ("content-type".to_string(), "application/json".to_string()),
        ("user-agent".to_string(), agent),
        (sign::HEADER_ID.to_string(), msg_id.to_string()),
        (sign::HEADER_TIMESTAMP.to_string(), timestamp.to_string()),
        (sign::HEADER_SIGNATURE.to_string(), signature),
    ];
    let body = Bytes::from(body);
    Some(Outgoing {
        url: url.clone(),
        headers,
        body,
        route: route.clone(),
        keep_headers: false,
        keep_body: crate::deliver::BODY_PREFIX,
        now,
    })
}
