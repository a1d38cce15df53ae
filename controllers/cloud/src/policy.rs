//! What to do with an external resource (pure): the managed reconciler's order
//! (Crossplane's), decided from what the object asks and what the provider
//! holds under the object's external name.
//!
//! Ownership is the point. Every resource Cairn creates carries an owner tag
//! with its object's UID, and the object carries a create-pending marker from
//! just before the create call until the outcome is recorded. So a controller
//! that crashed, or lost a response, finds what it created by name and owner,
//! or recognises its own interrupted create (present, untagged, made after the
//! marker), and carries on: no duplicate, no leak, no dead end. What belongs to
//! another object, or to nobody, is never changed or deleted unless adoption is
//! asked for, and then only what belongs to nobody.

use cairn_api::cloud::v1alpha1::{DeletionPolicy, ManagementPolicy};
use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// `"true"`: nothing is read or written until it is removed.
pub const PAUSED_ANNOTATION: &str = "cloud.cairn.dev/paused";
/// `"true"`: an existing resource under the object's name without an owner
/// tag is taken over (tagged as this object's). Never one tagged for another.
pub const ADOPT_ANNOTATION: &str = "cloud.cairn.dev/adopt";
/// When the controller began creating the resource (RFC 3339); removed once
/// the outcome is recorded.
pub const CREATE_PENDING_ANNOTATION: &str = "cloud.cairn.dev/create-pending";

/// How far the provider's clock may run behind ours when an untagged resource
/// is judged to be our own interrupted create.
const CLOCK_SLACK: SignedDuration = SignedDuration::from_secs(60);
/// How long after the marker an untagged resource may still be our create (a
/// create call is answered in seconds; later ones are someone else's).
const CLAIM_WINDOW: SignedDuration = SignedDuration::from_secs(300);

/// The object's side of a decision.
#[derive(Clone, Debug, PartialEq)]
pub struct Intent {
    pub deleting: bool,
    pub paused: bool,
    pub deletion: DeletionPolicy,
    pub management: ManagementPolicy,
    pub adopt: bool,
    /// The create-pending marker, if a create was begun and not recorded.
    pub create_pending_since: Option<Timestamp>,
    /// The object's UID: the owner tag of what it manages.
    pub uid: String,
    /// When the decision is made.
    pub now: Timestamp,
}

/// What the provider holds under the object's external name.
#[derive(Clone, Debug, PartialEq)]
pub enum Observed {
    Absent,
    Present {
        /// The owner tag's value: an object's UID.
        owner: Option<String>,
        /// When the provider says it was created, if it says.
        created: Option<Timestamp>,
        /// Whether it is as the spec asks.
        up_to_date: bool,
    },
}

/// The one step a reconcile takes; the next reconcile observes again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Paused: nothing is read or written.
    Skip,
    /// The object goes and the resource stays (policy Orphan, observe-only,
    /// not ours) or is gone: only the finalizer is removed.
    Release,
    /// The object goes with policy Delete and the resource is ours.
    Delete,
    /// Nothing there: mark the create pending, then create.
    Create,
    /// Ours without the tag (an interrupted create), or adoption asked: tag
    /// it, then it is corrected like any of ours.
    Claim,
    /// Ours, and not as specified: correct it.
    Update,
    /// Ours and as specified: observe again after the poll interval.
    UpToDate,
    /// Observe-only: report what is there.
    Report,
    /// Not ours to change: a terminal condition, looked at again when the
    /// object's spec (another name) or annotations (adoption) change.
    Refuse(Refusal),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Tagged as another object's (its UID).
    OwnedByAnother(String),
    /// Exists without an owner tag, and adoption was not asked for.
    NotOwned,
}

impl Refusal {
    /// The condition message: what is wrong and the way out.
    pub fn message(&self, name: &str) -> String {
        match self {
            Self::OwnedByAnother(uid) => format!(
                "{name} exists and belongs to another object (owner tag {uid}): choose another name"
            ),
            Self::NotOwned => format!(
                "{name} exists and was not created by Cairn: choose another name, or annotate \
                 {ADOPT_ANNOTATION}=true to manage it"
            ),
        }
    }
}

/// The steps decided before the provider is asked anything (a paused object,
/// or one leaving without touching the resource).
pub fn before_observing(intent: &Intent) -> Option<Step> {
    if intent.paused {
        return Some(Step::Skip);
    }
    let keeps_resource = intent.deletion == DeletionPolicy::Orphan
        || intent.management == ManagementPolicy::ObserveOnly;
    (intent.deleting && keeps_resource).then_some(Step::Release)
}

/// The step once the provider has been observed.
pub fn decide(intent: &Intent, observed: &Observed) -> Step {
    if let Some(step) = before_observing(intent) {
        return step;
    }
    let Observed::Present {
        owner,
        created,
        up_to_date,
    } = observed
    else {
        return match (intent.deleting, intent.management) {
            (true, _) => Step::Release,
            (false, ManagementPolicy::ObserveOnly) => Step::Report,
            (false, ManagementPolicy::Manage) => Step::Create,
        };
    };
    if intent.management == ManagementPolicy::ObserveOnly {
        return Step::Report;
    }
    match owner.as_deref() {
        Some(uid) if uid == intent.uid => {
            if intent.deleting {
                Step::Delete
            } else if *up_to_date {
                Step::UpToDate
            } else {
                Step::Update
            }
        }
        // Another object's: never changed, never deleted.
        Some(_) if intent.deleting => Step::Release,
        Some(other) => Step::Refuse(Refusal::OwnedByAnother(other.to_owned())),
        None if interrupted_create(intent, *created) => {
            if intent.deleting {
                Step::Delete
            } else {
                Step::Claim
            }
        }
        None if intent.deleting => Step::Release,
        None if intent.adopt => Step::Claim,
        None => Step::Refuse(Refusal::NotOwned),
    }
}

/// An untagged resource made just after this object's create began is that
/// create (it was absent when the create was decided).
fn interrupted_create(intent: &Intent, created: Option<Timestamp>) -> bool {
    let Some(since) = intent.create_pending_since else {
        return false;
    };
    match created {
        Some(created) => since - CLOCK_SLACK <= created && created <= since + CLAIM_WINDOW,
        // The provider does not say when: only a fresh marker decides.
        None => intent.now <= since + CLAIM_WINDOW,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0b1c-ours";

    fn intent() -> Intent {
        Intent {
            deleting: false,
            paused: false,
            deletion: DeletionPolicy::Delete,
            management: ManagementPolicy::Manage,
            adopt: false,
            create_pending_since: None,
            uid: UID.to_owned(),
            now: at(200),
        }
    }

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).unwrap_or(Timestamp::UNIX_EPOCH)
    }

    fn present(owner: Option<&str>, created: Option<i64>, up_to_date: bool) -> Observed {
        Observed::Present {
            owner: owner.map(str::to_owned),
            created: created.map(at),
            up_to_date,
        }
    }

    /// One table: (case, intent, observed, step).
    #[test]
    fn the_step_for_each_case() {
        let deleting = |deletion| Intent {
            deleting: true,
            deletion,
            ..intent()
        };
        let observe_only = Intent {
            management: ManagementPolicy::ObserveOnly,
            deletion: DeletionPolicy::Orphan,
            ..intent()
        };
        let pending = |seconds| Intent {
            create_pending_since: Some(at(seconds)),
            ..intent()
        };
        let cases: Vec<(&str, Intent, Observed, Step)> = vec![
            ("absent: create", intent(), Observed::Absent, Step::Create),
            (
                "ours, as specified",
                intent(),
                present(Some(UID), None, true),
                Step::UpToDate,
            ),
            (
                "ours, drifted",
                intent(),
                present(Some(UID), None, false),
                Step::Update,
            ),
            (
                "another object's",
                intent(),
                present(Some("other"), None, true),
                Step::Refuse(Refusal::OwnedByAnother("other".into())),
            ),
            (
                "another object's, adoption asked: still refused",
                Intent {
                    adopt: true,
                    ..intent()
                },
                present(Some("other"), None, true),
                Step::Refuse(Refusal::OwnedByAnother("other".into())),
            ),
            (
                "nobody's",
                intent(),
                present(None, Some(0), true),
                Step::Refuse(Refusal::NotOwned),
            ),
            (
                "nobody's, adoption asked",
                Intent {
                    adopt: true,
                    ..intent()
                },
                present(None, Some(0), false),
                Step::Claim,
            ),
            (
                "nobody's, made after our create began: our interrupted create",
                pending(100),
                present(None, Some(101), false),
                Step::Claim,
            ),
            (
                "nobody's, made just before our marker by a clock behind ours",
                pending(100),
                present(None, Some(70), false),
                Step::Claim,
            ),
            (
                "nobody's, made well before our create began: not ours",
                pending(100),
                present(None, Some(0), false),
                Step::Refuse(Refusal::NotOwned),
            ),
            (
                "nobody's, made long after our marker: someone else's",
                pending(100),
                present(None, Some(1000), false),
                Step::Refuse(Refusal::NotOwned),
            ),
            (
                "nobody's, no creation time, fresh marker",
                pending(100),
                present(None, None, false),
                Step::Claim,
            ),
            (
                "nobody's, no creation time, stale marker",
                Intent {
                    now: at(1000),
                    ..pending(100)
                },
                present(None, None, false),
                Step::Refuse(Refusal::NotOwned),
            ),
            (
                "ours after the lost response of a create",
                pending(100),
                present(Some(UID), Some(101), true),
                Step::UpToDate,
            ),
            (
                "deleting, Delete, ours",
                deleting(DeletionPolicy::Delete),
                present(Some(UID), None, true),
                Step::Delete,
            ),
            (
                "deleting, Delete, already gone",
                deleting(DeletionPolicy::Delete),
                Observed::Absent,
                Step::Release,
            ),
            (
                "deleting, Delete, another object's: never deleted",
                deleting(DeletionPolicy::Delete),
                present(Some("other"), None, true),
                Step::Release,
            ),
            (
                "deleting, Delete, nobody's: never deleted",
                deleting(DeletionPolicy::Delete),
                present(None, Some(0), true),
                Step::Release,
            ),
            (
                "deleting, Delete, our interrupted create",
                Intent {
                    deleting: true,
                    ..pending(100)
                },
                present(None, Some(101), true),
                Step::Delete,
            ),
            (
                "deleting, Orphan",
                deleting(DeletionPolicy::Orphan),
                present(Some(UID), None, true),
                Step::Release,
            ),
            (
                "observe-only, present",
                observe_only.clone(),
                present(None, None, false),
                Step::Report,
            ),
            (
                "observe-only, absent: never created",
                observe_only.clone(),
                Observed::Absent,
                Step::Report,
            ),
            (
                "observe-only, deleting",
                Intent {
                    deleting: true,
                    ..observe_only
                },
                present(Some(UID), None, true),
                Step::Release,
            ),
            (
                "paused",
                Intent {
                    paused: true,
                    ..intent()
                },
                Observed::Absent,
                Step::Skip,
            ),
            (
                "paused while deleting",
                Intent {
                    paused: true,
                    ..deleting(DeletionPolicy::Delete)
                },
                present(Some(UID), None, true),
                Step::Skip,
            ),
        ];
        for (case, intent, observed, step) in cases {
            assert_eq!(decide(&intent, &observed), step, "{case}");
        }
    }

    #[test]
    fn orphaning_and_pausing_need_no_call_to_the_provider() {
        let orphan = Intent {
            deleting: true,
            deletion: DeletionPolicy::Orphan,
            ..intent()
        };
        assert_eq!(before_observing(&orphan), Some(Step::Release));
        let paused = Intent {
            paused: true,
            ..intent()
        };
        assert_eq!(before_observing(&paused), Some(Step::Skip));
        assert_eq!(before_observing(&intent()), None);
        let deleting = Intent {
            deleting: true,
            ..intent()
        };
        assert_eq!(before_observing(&deleting), None, "Delete looks first");
    }

    #[test]
    fn a_refusal_names_the_way_out() {
        assert!(Refusal::NotOwned.message("b").contains(ADOPT_ANNOTATION));
        assert!(
            Refusal::OwnedByAnother("u".into())
                .message("b")
                .contains("another name")
        );
    }
}
