//! Status conditions, merged the way `meta.SetStatusCondition` does: a
//! condition's `lastTransitionTime` moves only when its status changes, so a
//! reconcile that observes nothing new writes nothing new.

pub use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// A time as the API server stores it: a `Time` is written in whole
/// seconds. A status holding a finer time differs from its own stored copy
/// at every later look, and would be written again each time.
pub fn stored_time(at: k8s_openapi::jiff::Timestamp) -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_second(at.as_second()).unwrap_or(at))
}

/// A condition of `type_` observed at `generation`, with `now` (in whole
/// seconds, as stored) as its transition time if it turns out to be a
/// transition.
pub fn new(
    type_: &str,
    status: bool,
    reason: &str,
    message: impl Into<String>,
    generation: Option<i64>,
    now: Time,
) -> Condition {
    Condition {
        type_: type_.to_owned(),
        status: if status { "True" } else { "False" }.to_owned(),
        reason: reason.to_owned(),
        message: message.into(),
        observed_generation: generation,
        last_transition_time: stored_time(now.0),
    }
}

/// Puts `condition` into `conditions`, replacing the one of the same type.
/// The existing `lastTransitionTime` is kept unless the status changed.
/// Returns whether `conditions` changed.
pub fn set(conditions: &mut Vec<Condition>, mut condition: Condition) -> bool {
    match conditions.iter_mut().find(|c| c.type_ == condition.type_) {
        None => {
            conditions.push(condition);
            true
        }
        Some(existing) => {
            if existing.status == condition.status {
                condition.last_transition_time = existing.last_transition_time.clone();
            }
            let changed = *existing != condition;
            *existing = condition;
            changed
        }
    }
}

/// Gives every condition of `conditions` whose status is the same in
/// `previous` (the status last written) the transition time it has there.
/// A status assembled in steps, a later one overriding a condition an
/// earlier one set, would otherwise count the step in between as a
/// transition: a new `lastTransitionTime`, and a write, at every reconcile.
pub fn keep_transition_times(conditions: &mut [Condition], previous: &[Condition]) {
    for condition in conditions {
        if let Some(before) = find(previous, &condition.type_)
            && before.status == condition.status
        {
            condition.last_transition_time = before.last_transition_time.clone();
        }
    }
}

/// The condition of `type_`, if present.
pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Whether the condition of `type_` is present with status True.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    find(conditions, type_).is_some_and(|c| c.status == "True")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(seconds).expect("valid second"))
    }

    #[test]
    fn a_new_type_is_added() {
        let mut conditions = Vec::new();
        assert!(set(
            &mut conditions,
            new("Ready", false, "Creating", "", Some(1), at(10))
        ));
        assert_eq!(conditions.len(), 1);
        assert!(!is_true(&conditions, "Ready"));
    }

    #[test]
    fn a_condition_overridden_back_to_its_previous_status_keeps_its_transition_time() {
        let previous = vec![new(
            "Progressing",
            true,
            "FailoverBlocked",
            "",
            Some(1),
            at(10),
        )];
        // One step of the build sets it False, a later one True again.
        let mut conditions = previous.clone();
        set(
            &mut conditions,
            new("Progressing", false, "Converged", "", Some(1), at(20)),
        );
        set(
            &mut conditions,
            new("Progressing", true, "FailoverBlocked", "", Some(1), at(20)),
        );
        assert_eq!(conditions[0].last_transition_time, at(20));
        keep_transition_times(&mut conditions, &previous);
        assert_eq!(conditions, previous);
        // A real transition keeps its new time.
        set(
            &mut conditions,
            new("Progressing", false, "Converged", "", Some(1), at(30)),
        );
        keep_transition_times(&mut conditions, &previous);
        assert_eq!(conditions[0].last_transition_time, at(30));
    }

    #[test]
    fn the_same_status_keeps_its_transition_time() {
        let mut conditions = vec![new("Ready", true, "Running", "all good", Some(1), at(10))];
        assert!(!set(
            &mut conditions,
            new("Ready", true, "Running", "all good", Some(1), at(99))
        ));
        assert_eq!(conditions[0].last_transition_time, at(10));
        // A new message or generation is a change, but not a transition.
        assert!(set(
            &mut conditions,
            new("Ready", true, "Running", "3/3 ready", Some(2), at(99))
        ));
        assert_eq!(conditions[0].last_transition_time, at(10));
        assert_eq!(conditions[0].observed_generation, Some(2));
    }

    #[test]
    fn a_status_change_is_a_transition() {
        let mut conditions = vec![
            new("Ready", true, "Running", "", Some(1), at(10)),
            new("Degraded", false, "AllHealthy", "", Some(1), at(10)),
        ];
        assert!(set(
            &mut conditions,
            new("Ready", false, "InstanceDown", "pod 2", Some(1), at(50))
        ));
        let ready = find(&conditions, "Ready").expect("present");
        assert_eq!(ready.last_transition_time, at(50));
        assert_eq!(ready.reason, "InstanceDown");
        assert_eq!(
            find(&conditions, "Degraded").map(|c| &c.last_transition_time),
            Some(&at(10))
        );
    }

    #[test]
    fn a_transition_time_is_kept_in_whole_seconds_as_stored() {
        let now: k8s_openapi::jiff::Timestamp = "2026-11-26T12:00:00.731Z".parse().expect("time");
        let condition = new("Ready", true, "Ok", "", None, Time(now));
        assert_eq!(condition.last_transition_time, at(now.as_second()));
        let stored: Condition =
            serde_json::from_value(serde_json::to_value(&condition).expect("json")).expect("back");
        assert_eq!(stored, condition);
    }
}
