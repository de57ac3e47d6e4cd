//! AMQP 0-9-1 destinations (`lapin`; linked only here). Not built yet: every publish fails
//! as `other` and is retried per policy.

use super::broker::{Message, failed};
use crate::classify::{Outcome, TransportErrorKind};

/// The AMQP connections of a node, one per destination.
#[derive(Default)]
pub(super) struct Amqp;

impl Amqp {
    pub(super) async fn publish(&self, _m: &Message) -> Outcome {
        failed(TransportErrorKind::Other, "amqp destinations are not built yet")
    }
}
