//! Every ordering of claim at intake that the commit history fixed, one table row each: a
//! row is a script of what the partition, intake and the store's writer thread do, in the
//! order they do it, with what each step must answer.

use super::*;
use crate::model::{DeliveryId, EventId, TenantId};

/// One thing that happens to a partition's knowledge, and what it must answer.
#[derive(Debug, Clone, Copy)]
enum Step {
    /// A claim is submitted, to open on these terms if it drains (`expect`).
    Expect(Option<Open>),
    /// The store applies that claim as op `seq`, having taken this many and found nothing
    /// else due (`claimed`).
    Applied(u64, usize),
    /// Intake asks for a lease at `now`; the answer.
    Lease(Millis, Option<Millis>),
    /// A wake for work from op `seq`; whether it is news.
    Wake(u64, bool),
    /// The endpoint changed.
    Changed,
    /// A delivery was leased to the partition at intake.
    Hand,
    /// The partition takes the news of work; whether there was any.
    TakeFresh(bool),
    /// The partition takes the news of a change; whether there was one.
    TakeChanged(bool),
    /// The partition read its endpoint; whether it had been stale.
    Read(bool),
    /// A prefetch answered: short, next due.
    Prefetched(bool, Option<Millis>),
    /// A refill answered: short, next due.
    Refilled(bool, Option<Millis>),
    /// The claim answered: its terms are forgotten.
    Forget,
    /// The partition hands its queue back.
    ForgetDue,
    /// The partition publishes these terms (halted, prefetch under way).
    Publish(Option<Open>, bool, bool),
    /// The partition closes to intake (handing back).
    Close,
    /// The partition tries to retire; whether it may.
    Retire(bool),
    /// The partition takes its inbox; how many it finds.
    TakeInbox(usize),
    /// Terms to open on now (held until, queued, halted), claims of 10 leased 500 ms.
    OpenTerms(Millis, u32, bool, Option<Open>),
    /// Terms to expect for a claim of `ahead` more (held until, queued, ahead, halted).
    Terms(Millis, u32, u32, bool, Option<Open>),
    /// Before claiming at `now` (halted, a retry due again): the next due time.
    NextDue(Millis, bool, Option<Millis>, Stored),
    /// What the partition knows of the store now.
    Is(Stored),
}

use Step::*;

const fn open(held_until: Millis, room: u32) -> Option<Open> {
    Some(Open { held_until, lease_ms: 500, room })
}

const HELD: Millis = 10_000;
const DRAINED: Stored = Stored::Drained { next_due: None };
const UNKNOWN: Stored = Stored::Unknown;

/// A claim of 10, leased 500 ms plus 10 ms per delivery queued.
fn claim(queued: u32) -> (u32, Millis) {
    (10, 500 + 10 * Millis::from(queued))
}

fn delivery() -> Claimed {
    Claimed {
        id: DeliveryId::from_stored("dl_1"),
        tenant: TenantId::from_stored("t_1"),
        event_id: EventId::from_stored("ev_1"),
        event_type: "a".into(),
        payload: "{}".into(),
        event_created_at: 0,
        expires_at: Millis::MAX,
        attempts: 0,
        attempt_base: 0,
        deadline: None,
        replay: None,
        fence: 1,
        trace: None,
        schema_version: None,
    }
}

#[rustfmt::skip]
const ORDERINGS: &[(&str, &[Step])] = &[
    ("a drained claim opens as it is applied: intake later in its commit hands over", &[
        Expect(open(HELD, 4)), Lease(100, None), Applied(5, 1),
        Lease(100, Some(600)), Lease(101, Some(601)), Lease(102, Some(602)), Lease(103, None),
        Forget, Prefetched(true, None), Is(DRAINED), TakeFresh(false), Is(DRAINED),
    ]),
    ("intake before the claim, woken before it applies: the claim takes its work", &[
        Expect(open(HELD, 4)), Lease(100, None), Wake(4, true), Applied(5, 2),
        TakeFresh(false), Forget, Prefetched(true, Some(900)), Is(Stored::Drained { next_due: Some(900) }),
        Lease(100, Some(600)), Lease(100, Some(600)), Lease(100, None),
    ]),
    ("intake before the claim, woken after it applied: not news", &[
        Expect(open(HELD, 4)), Applied(5, 2), Wake(4, false), Wake(5, false),
        TakeFresh(false), Forget, Prefetched(true, None), Is(DRAINED),
    ]),
    ("work after the claim's op is news: the store is unknown again", &[
        Expect(open(HELD, 4)), Applied(5, 1), Wake(6, true),
        Forget, Prefetched(true, None), Is(UNKNOWN), TakeFresh(true), Is(UNKNOWN),
        Lease(100, Some(600)),
    ]),
    ("an unordered wake is always news", &[
        Expect(None), Applied(5, 1), Wake(0, true), TakeFresh(true),
        Refilled(true, None), Is(DRAINED), Wake(3, false), Wake(0, true), TakeFresh(true), Is(UNKNOWN),
    ]),
    ("a later claim raises what is seen; an earlier one does not lower it", &[
        Expect(None), Applied(9, 0), Expect(None), Applied(7, 0), Wake(8, false), Wake(10, true),
    ]),
    ("a change during a claim: it opens nothing, and the endpoint is read first", &[
        Expect(open(HELD, 4)), Changed, Applied(5, 1), Lease(100, None),
        Forget, Prefetched(true, None), Is(DRAINED),
        TakeChanged(true), Is(UNKNOWN), TakeChanged(false),
        Terms(HELD, 0, 10, false, None), Read(true), Read(false),
        Terms(HELD, 0, 10, false, Some(Open { held_until: HELD, lease_ms: 600, room: 10 })),
    ]),
    ("a change while open closes at once", &[
        Expect(open(HELD, 4)), Applied(5, 1), Lease(100, Some(600)), Changed, Lease(100, None),
    ]),
    ("a change not yet taken opens nothing: the loop may be past taking it (a rotated secret)", &[
        Refilled(true, None), Changed,
        OpenTerms(HELD, 0, false, None), Terms(HELD, 0, 10, false, None),
        TakeChanged(true), OpenTerms(HELD, 0, false, None), Read(true),
        Terms(HELD, 0, 10, false, Some(Open { held_until: HELD, lease_ms: 600, room: 10 })),
    ]),
    ("hand-back closes first; a partition with deliveries in its inbox does not retire", &[
        Expect(open(HELD, 4)), Applied(5, 0), Lease(100, Some(600)), Hand,
        Close, Lease(100, None), Retire(false), TakeInbox(1), Retire(true), TakeInbox(0), Lease(100, None),
    ]),
    ("retiring closes", &[
        Expect(open(HELD, 4)), Applied(5, 0), Retire(true), Lease(100, None),
    ]),
    ("a lease is given only while the partition lease holds", &[
        Expect(open(1_000, 4)), Applied(5, 0), Lease(999, Some(1_499)), Lease(1_000, None), Lease(1_001, None),
    ]),
    ("room runs out: a claim that took all of it opens nothing", &[
        Expect(open(HELD, 2)), Applied(5, 2), Lease(100, None),
        Expect(open(HELD, 2)), Applied(6, 5), Lease(100, None),
        Expect(open(HELD, 2)), Applied(7, 1), Lease(100, Some(600)), Lease(100, None),
    ]),
    ("a claim the store did not call drained knows nothing and opens nothing", &[
        Expect(open(HELD, 4)), Forget, Prefetched(true, Some(5)), Is(UNKNOWN), Lease(100, None),
    ]),
    ("a claim that got all it asked for knows nothing, even applied drained", &[
        Expect(open(HELD, 4)), Applied(5, 4), Forget, Prefetched(false, None), Is(UNKNOWN),
    ]),
    ("terms forgotten once the claim answered: a late apply opens nothing", &[
        Expect(open(HELD, 4)), Forget, Applied(5, 0), Lease(100, None),
    ]),
    ("the drained news is used once: a next claim must be applied drained itself", &[
        Expect(None), Applied(5, 0), Prefetched(true, None), Is(DRAINED), ForgetDue, Is(UNKNOWN),
        Prefetched(true, None), Is(UNKNOWN),
    ]),
    ("a refill knows what its own answer says", &[
        Refilled(true, Some(50)), Is(Stored::Drained { next_due: Some(50) }),
        Refilled(false, None), Is(UNKNOWN),
    ]),
    ("the next due time: the sooner of the claim's answer and a retry; unknown once come", &[
        NextDue(10, false, Some(1), UNKNOWN),
        Refilled(true, Some(50)), NextDue(10, false, Some(40), Stored::Drained { next_due: Some(40) }),
        NextDue(10, false, Some(45), Stored::Drained { next_due: Some(40) }),
        NextDue(40, false, None, UNKNOWN), Is(UNKNOWN),
        Refilled(true, None), NextDue(10, false, None, DRAINED), NextDue(10, false, Some(20), Stored::Drained { next_due: Some(20) }),
        Refilled(true, Some(50)), NextDue(10, true, None, UNKNOWN),
    ]),
    ("open terms only while drained: room is a claim less the queue and the inbox", &[
        OpenTerms(HELD, 0, false, None),
        Refilled(true, None), OpenTerms(HELD, 0, false, Some(Open { held_until: HELD, lease_ms: 500, room: 10 })),
        Hand, OpenTerms(HELD, 3, false, Some(Open { held_until: HELD, lease_ms: 540, room: 6 })),
        OpenTerms(HELD, 9, false, None), OpenTerms(HELD, 0, true, None),
    ]),
    ("published terms open and close; a halt also drops the expected terms", &[
        Refilled(true, None), Publish(open(HELD, 2), false, false), Lease(100, Some(600)),
        Publish(None, false, false), Lease(100, None),
        Expect(open(HELD, 2)), Publish(None, true, false), Applied(5, 0), Lease(100, None),
    ]),
    ("a close is left to a prefetch under way that may open as it is applied, until it has", &[
        Refilled(true, None), Publish(open(HELD, 2), false, false), ForgetDue,
        Expect(open(HELD, 3)), Publish(None, false, true), Lease(100, Some(600)),
        Applied(5, 0), Lease(100, Some(600)), Lease(100, Some(600)), Lease(100, Some(600)), Lease(100, None),
        Publish(None, false, false), Expect(open(HELD, 3)), Publish(None, false, false), Applied(6, 0),
        Publish(None, false, true), Lease(100, None),
    ]),
];

#[test]
fn claim_at_intake_orderings() {
    for (name, steps) in ORDERINGS {
        let mut k = Known::default();
        for (i, step) in steps.iter().enumerate() {
            let at = format!("{name}: step {i} ({step:?})");
            match *step {
                Expect(terms) => k.expect(terms),
                Applied(seq, n) => k.claimed(seq, n),
                Lease(now, want) => assert_eq!(k.lease(now), want, "{at}"),
                Wake(seq, news) => assert_eq!(k.work_after(seq), news, "{at}"),
                Changed => k.changed(),
                Hand => k.hand(delivery()),
                TakeFresh(want) => assert_eq!(k.take_fresh(), want, "{at}"),
                TakeChanged(want) => assert_eq!(k.take_changed(), want, "{at}"),
                Read(want) => assert_eq!(k.read(), want, "{at}"),
                Prefetched(short, next) => k.prefetched(short, next),
                Refilled(short, next) => k.refilled(short, next),
                Forget => k.forget_terms(),
                ForgetDue => k.forget_due(),
                Publish(terms, halted, claiming) => k.publish(terms, halted, claiming),
                Close => k.close(),
                Retire(want) => assert_eq!(k.retire(), want, "{at}"),
                TakeInbox(n) => assert_eq!(k.take_inbox().len(), n, "{at}"),
                OpenTerms(held, queued, halted, want) => {
                    assert_eq!(k.open_terms(held, queued, halted, claim), want, "{at}")
                }
                Terms(held, queued, ahead, halted, want) => {
                    assert_eq!(k.terms(held, queued, ahead, halted, claim), want, "{at}")
                }
                NextDue(now, halted, again, want) => assert_eq!(k.next_due(now, halted, || again), want, "{at}"),
                Is(want) => assert_eq!(k.stored, want, "{at}"),
            }
        }
    }
}

/// A retry due again is read only while the store is known drained: otherwise it stays
/// for the next look (the partition's `due_again` is taken, not peeked).
#[test]
fn next_due_reads_a_retry_only_when_drained() {
    let mut k = Known::default();
    assert_eq!(k.next_due(0, false, || panic!("read while unknown")), Stored::Unknown);
    k.refilled(true, None);
    let mut read = false;
    k.next_due(0, false, || {
        read = true;
        None
    });
    assert!(read);
}
