//! Kubernetes Events on transitions: one Event when a condition changes
//! status or reason, none when a reconcile merely confirms the state (events
//! are writes too, and an Event per reconcile would flood `kubectl describe`).

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder};

use crate::conditions::Condition;

/// The reason of `Progressing=False` when the work is done: the healthy
/// end of progress, not a failure to progress.
pub const CONVERGED: &str = "Converged";

/// The Event announcing `current`, if it differs from `previous` (the
/// condition of the same type before this reconcile). A condition turning
/// False is a Warning when its type is one where True is healthy
/// (`Progressing` is healthy when True and when it ended [`CONVERGED`]). A
/// condition's first appearance is announced only when it is a problem: a
/// new object's healthy conditions (`Degraded=False`, `Progressing=True`)
/// are no news, and every Event is a write.
pub fn on_transition(previous: Option<&Condition>, current: &Condition) -> Option<Event> {
    if previous.is_some_and(|p| p.status == current.status && p.reason == current.reason) {
        return None;
    }
    let healthy = match current.type_.as_str() {
        // For these, True is the bad state.
        "Degraded" | "Stalled" => current.status != "True",
        "Progressing" => current.status != "False" || current.reason == CONVERGED,
        _ => current.status != "False",
    };
    if previous.is_none() && healthy {
        return None;
    }
    Some(Event {
        type_: if healthy {
            EventType::Normal
        } else {
            EventType::Warning
        },
        reason: current.reason.clone(),
        note: (!current.message.is_empty()).then(|| truncate(&current.message, 1024)),
        action: format!("Set{}", current.type_),
        secondary: None,
    })
}

/// Publishes an Event of `type_` about `object`, its `reason` also its
/// action. An Event is a courtesy: one that cannot be published is logged,
/// never a failure of the reconcile that made it.
pub async fn publish(
    recorder: &Recorder,
    object: &ObjectReference,
    type_: EventType,
    reason: &str,
    note: String,
) {
    let event = Event {
        type_,
        reason: reason.to_owned(),
        note: Some(note),
        action: reason.to_owned(),
        secondary: None,
    };
    publish_event(recorder, object, &event).await;
}

/// [`publish`] for an Event made already (by [`on_transition`]).
pub async fn publish_event(recorder: &Recorder, object: &ObjectReference, event: &Event) {
    if let Err(e) = recorder.publish(event, object).await {
        tracing::warn!(error = %e, reason = %event.reason, "could not publish an Event");
    }
}

/// Publishes the Event of each condition in `current` that changed from
/// `previous` (see [`on_transition`]): what a controller does after it wrote
/// a status. A condition False for one of the reasons `in_progress` (work
/// under way: creating, updating) is no problem: Normal, and no news at its
/// first appearance.
pub async fn announce_transitions(
    recorder: &Recorder,
    object: &ObjectReference,
    previous: &[Condition],
    current: &[Condition],
    in_progress: &[&str],
) {
    for event in transitions(previous, current, in_progress) {
        publish_event(recorder, object, &event).await;
    }
}

/// The Events [`announce_transitions`] publishes (pure: unit-tested).
fn transitions(previous: &[Condition], current: &[Condition], in_progress: &[&str]) -> Vec<Event> {
    current
        .iter()
        .filter_map(|condition| {
            let before = previous.iter().find(|p| p.type_ == condition.type_);
            let progress = in_progress.contains(&condition.reason.as_str());
            if progress && before.is_none() {
                return None;
            }
            let mut event = on_transition(before, condition)?;
            if progress {
                event.type_ = EventType::Normal;
            }
            Some(event)
        })
        .collect()
}

/// At most `max` bytes of `text`, cut at a character boundary.
fn truncate(text: &str, max: usize) -> String {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conditions::{Time, new};

    fn at(seconds: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(seconds).expect("valid second"))
    }

    #[test]
    fn only_transitions_make_events() {
        let creating = new("Ready", false, "Creating", "0/3", Some(1), at(0));
        let ready = new("Ready", true, "Running", "3/3", Some(1), at(1));
        let event = on_transition(Some(&creating), &ready).expect("a transition");
        assert_eq!(event.type_, EventType::Normal);
        assert_eq!(event.reason, "Running");
        assert_eq!(event.action, "SetReady");
        assert!(
            on_transition(None, &ready).is_none(),
            "a healthy first appearance is no news"
        );
        let healthy = new("Degraded", false, "Healthy", "", None, at(1));
        assert!(on_transition(None, &healthy).is_none());

        let same = new("Ready", true, "Running", "3/3 again", Some(2), at(2));
        assert!(
            on_transition(Some(&ready), &same).is_none(),
            "a new message alone is no transition"
        );

        let down = new(
            "Ready",
            false,
            "InstanceDown",
            "pod orders-2 is not ready",
            Some(2),
            at(3),
        );
        let event = on_transition(Some(&ready), &down).expect("status changed");
        assert_eq!(event.type_, EventType::Warning);
        assert_eq!(event.note.as_deref(), Some("pod orders-2 is not ready"));
    }

    #[test]
    fn progress_that_ends_converged_is_normal_and_one_that_stops_short_a_warning() {
        let rolling = new("Progressing", true, "RollingOut", "1/3", Some(2), at(1));
        let converged = new("Progressing", false, CONVERGED, "3/3", Some(2), at(2));
        let event = on_transition(Some(&rolling), &converged).expect("a transition");
        assert_eq!(event.type_, EventType::Normal);
        let refused = new(
            "Progressing",
            false,
            "SwitchoverRefused",
            "no replica",
            Some(2),
            at(3),
        );
        let event = on_transition(Some(&converged), &refused).expect("a transition");
        assert_eq!(event.type_, EventType::Warning);
    }

    #[test]
    fn degraded_true_is_the_warning() {
        let degraded = new("Degraded", true, "ReplicaLagging", "", None, at(1));
        let event = on_transition(None, &degraded).expect("event");
        assert_eq!(event.type_, EventType::Warning);
        assert_eq!(event.note, None);
    }

    #[test]
    fn work_under_way_is_normal_and_no_news_when_it_begins() {
        use std::slice::from_ref as one;
        let progress = ["Creating", "Updating"];
        let creating = new("Ready", false, "Creating", "bucket b", None, at(1));
        let available = new("Ready", true, "Available", "bucket b", None, at(2));
        let updating = new("Ready", false, "Updating", "bucket b", None, at(3));
        let failed = new("Synced", false, "CannotCreate", "denied", None, at(4));
        let kinds = |events: Vec<Event>| -> Vec<(EventType, String)> {
            events.into_iter().map(|e| (e.type_, e.reason)).collect()
        };
        assert!(transitions(&[], one(&creating), &progress).is_empty());
        assert_eq!(
            kinds(transitions(one(&creating), one(&available), &progress)),
            [(EventType::Normal, "Available".to_owned())]
        );
        assert_eq!(
            kinds(transitions(one(&available), one(&updating), &progress)),
            [(EventType::Normal, "Updating".to_owned())]
        );
        assert!(
            transitions(one(&updating), one(&updating), &progress).is_empty(),
            "no transition, no Event"
        );
        let refused = [available.clone(), failed];
        assert_eq!(
            kinds(transitions(one(&available), &refused, &progress)),
            [(EventType::Warning, "CannotCreate".to_owned())]
        );
    }

    #[test]
    fn long_messages_are_cut_at_a_character_boundary() {
        let text = "é".repeat(600); // 1200 bytes
        let cut = truncate(&text, 1024);
        assert!(cut.len() <= 1024 && cut.chars().all(|c| c == 'é'));
    }
}
