//! What PostgreSQL's files and programs say about WAL and timelines: WAL
//! file names, timeline history files, the control file (pg_controldata),
//! pg_rewind's output. Pure functions of text (one lists a folder), tested
//! without a server.

use std::collections::BTreeSet;
use std::path::Path;

use cairn_api::database::instance::parse_lsn;

/// A former primary's folder holds diverged WAL, unless its last run was in
/// recovery (a standby, or a folder pg_rewind has finished) or it is a fresh
/// base backup (backup_label; its control file is the primary's).
#[derive(Debug, PartialEq, Eq)]
pub(super) struct ControlData {
    pub(super) was_primary: bool,
    /// `shut down`: the last run of a primary ended with a shutdown
    /// checkpoint, which a fast or smart stop sends to the streaming
    /// replicas before it exits. An immediate stop (or a crash) leaves
    /// `in production`, with WAL past the latest checkpoint.
    pub(super) shut_down: bool,
    pub(super) timeline: u32,
    /// `Latest checkpoint location`, as `X/Y`.
    pub(super) checkpoint: Option<String>,
    /// `Minimum recovery ending location`: where a rewound folder becomes
    /// consistent (0 when not set).
    pub(super) min_recovery_point: Option<u64>,
}

impl ControlData {
    pub(super) fn parse(output: &str, has_backup_label: bool) -> Option<Self> {
        let field = |name: &str| {
            output
                .lines()
                .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
                .map(str::trim)
        };
        let state = field("Database cluster state")?;
        let timeline = field("Latest checkpoint's TimeLineID")?.parse().ok()?;
        let in_recovery = matches!(state, "shut down in recovery" | "in archive recovery");
        Some(Self {
            was_primary: !in_recovery && !has_backup_label,
            shut_down: state == "shut down",
            timeline,
            checkpoint: field("Latest checkpoint location").map(str::to_owned),
            min_recovery_point: field("Minimum recovery ending location").and_then(parse_lsn),
        })
    }

    /// Where a primary's clean shutdown wrote its last record: a replica
    /// that received WAL past it has every commit. None after an immediate
    /// stop, whose last records no checkpoint marks.
    pub(super) fn shutdown_checkpoint(&self) -> Option<&str> {
        (self.was_primary && self.shut_down)
            .then_some(self.checkpoint.as_deref())
            .flatten()
    }
}

/// pg_rewind prints this before it changes the target folder.
pub(super) fn rewind_started(output: &str) -> bool {
    output.contains("rewinding from last common checkpoint")
}

/// pg_rewind stopped, before changing anything, on the folder's own WAL: it
/// no longer reaches back to the point both histories share, or a record
/// cannot be read. No retry brings that WAL back. (A source of another
/// system is not among these: that is the wrong server, not a clone's job.)
pub(super) fn lacks_own_wal(output: &str) -> bool {
    output.contains("could not find previous WAL record")
        || output.contains("could not read WAL record at")
}

/// The first WAL segment (by number) from the one holding `start` to the one
/// holding `end` that neither this folder (`local`) nor the primary
/// (`primary`) has. (Which timeline's file is not checked: a miss errs
/// toward the rewind, as before this check.)
pub(super) fn first_missing_segment(
    start: u64,
    end: u64,
    segment_size: u64,
    local: &BTreeSet<u64>,
    primary: &BTreeSet<u64>,
) -> Option<u64> {
    let size = segment_size.max(1);
    (start / size..=end / size).find(|n| !local.contains(n) && !primary.contains(n))
}

/// The segment number of a WAL file name (`TTTTTTTTXXXXXXXXYYYYYYYY`).
pub(super) fn segment_number(name: &str, segment_size: u64) -> Option<u64> {
    if name.len() != 24 || !name.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let log = u64::from_str_radix(&name[8..16], 16).ok()?;
    let seg = u64::from_str_radix(&name[16..24], 16).ok()?;
    Some(log * 0x1_0000_0000u64.checked_div(segment_size)? + seg)
}

/// The highest timeline with a history file in the folder's pg_wal (0 if none).
pub(super) fn latest_history(data: &Path) -> u32 {
    let Ok(entries) = std::fs::read_dir(data.join("pg_wal")) else {
        return 0;
    };
    entries
        .flatten()
        .filter_map(|entry| history_timeline(&entry.file_name().to_string_lossy()))
        .max()
        .unwrap_or(0)
}

/// `0000000A.history` → 10.
fn history_timeline(name: &str) -> Option<u32> {
    let hex = name.strip_suffix(".history")?;
    (hex.len() == 8).then_some(())?;
    u32::from_str_radix(hex, 16).ok()
}

/// Whether a server on `timeline`, replayed up to `position`, diverged from
/// the history a `.history` file describes: its timeline is not an ancestor,
/// or it replayed WAL past the point where the history left it.
pub(super) fn forked(history: &str, timeline: u32, position: u64) -> Option<String> {
    let switch = switches(history).find_map(|(parent, at)| (parent == timeline).then_some(at));
    match switch {
        None => Some(format!("timeline {timeline} is not in its history")),
        Some(at) if position > at => Some(format!(
            "it replayed timeline {timeline} up to {}, past the switch at {}",
            format_lsn(position),
            format_lsn(at)
        )),
        Some(_) => None,
    }
}

/// The name of the WAL segment holding the switch away from `timeline`, as
/// recovery reads it (from the newest timeline that began in or before
/// that segment: a second switch in the same segment names it after the
/// later timeline) given `history`, the history file of `current`: the
/// first segment a folder of `timeline` needs from the primary.
pub(super) fn first_segment_after_switch(
    history: &str,
    timeline: u32,
    current: u32,
    segment_size: u64,
) -> Option<String> {
    let lines: Vec<(u32, u64)> = switches(history).collect();
    let later = &lines[lines.iter().position(|(parent, _)| *parent == timeline)?..];
    let per_log = 0x1_0000_0000u64
        .checked_div(segment_size)
        .filter(|n| *n > 0)?;
    let segment = later[0].1 / segment_size;
    // The timeline begun by line i is the parent on line i + 1.
    let last = later
        .iter()
        .rposition(|(_, at)| at / segment_size == segment)?;
    let reader = later.get(last + 1).map_or(current, |(parent, _)| *parent);
    Some(format!(
        "{reader:08X}{:08X}{:08X}",
        segment / per_log,
        segment % per_log
    ))
}

/// The lines of a timeline history file: each timeline and where it
/// switched to the next one.
fn switches(history: &str) -> impl Iterator<Item = (u32, u64)> + '_ {
    history.lines().filter_map(|line| {
        let mut fields = line.split_whitespace();
        let parent: u32 = fields.next()?.parse().ok()?;
        Some((parent, parse_lsn(fields.next()?)?))
    })
}

pub(super) fn format_lsn(lsn: u64) -> String {
    format!("{:X}/{:X}", lsn >> 32, lsn & 0xFFFF_FFFF)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_folder_was_a_primary_unless_its_last_run_was_in_recovery() {
        let control = |state: &str, backup_label: bool| {
            let output = format!(
                "pg_control version number:            1300\n\
                 Database cluster state:               {state}\n\
                 Latest checkpoint's TimeLineID:       3\n"
            );
            ControlData::parse(&output, backup_label).map(|c| (c.was_primary, c.timeline))
        };
        for state in [
            "in production",
            "shut down",
            "shutting down",
            "in crash recovery",
        ] {
            assert_eq!(control(state, false), Some((true, 3)), "{state}");
        }
        for state in ["shut down in recovery", "in archive recovery"] {
            assert_eq!(control(state, false), Some((false, 3)), "{state}");
        }
        // A fresh base backup carries the primary's control file.
        assert_eq!(control("in production", true), Some((false, 3)));
        assert_eq!(ControlData::parse("garbage", false), None);
    }

    #[test]
    fn only_a_clean_shutdown_reports_its_checkpoint() {
        let control = |state: &str| {
            let output = format!(
                "Database cluster state:               {state}\n\
                 Latest checkpoint location:           0/3000148\n\
                 Latest checkpoint's TimeLineID:       3\n"
            );
            let control = ControlData::parse(&output, false).expect("parsed");
            control.shutdown_checkpoint().map(str::to_owned)
        };
        assert_eq!(control("shut down").as_deref(), Some("0/3000148"));
        // An immediate stop: WAL past the checkpoint may never have been sent.
        for state in ["in production", "shutting down", "shut down in recovery"] {
            assert_eq!(control(state), None, "{state}");
        }
    }

    #[test]
    fn a_segment_neither_side_has_is_found() {
        let mb16 = 16 * 1024 * 1024;
        assert_eq!(segment_number("000000020000000100000005", mb16), Some(261));
        assert_eq!(segment_number("00000002.history", mb16), None);
        let local: BTreeSet<u64> = [2, 3].into();
        let primary: BTreeSet<u64> = [5, 6, 7].into();
        // Replay from 0/2000028 to 0/6000100: segment 4 is nowhere.
        assert_eq!(
            first_missing_segment(0x200_0028, 0x600_0100, mb16, &local, &primary),
            Some(4)
        );
        let primary: BTreeSet<u64> = [4, 5, 6, 7].into();
        assert_eq!(
            first_missing_segment(0x200_0028, 0x600_0100, mb16, &local, &primary),
            None
        );
    }

    #[test]
    fn the_first_segment_after_a_switch_is_on_the_next_timeline() {
        let history = "1\t0/3000148\tno recovery target specified\n\n2\t1/5000000\tno recovery target specified\n";
        let mb16 = 16 * 1024 * 1024;
        assert_eq!(
            first_segment_after_switch(history, 1, 3, mb16).as_deref(),
            Some("000000020000000000000003")
        );
        // A switch on a segment boundary: the segment that starts there.
        assert_eq!(
            first_segment_after_switch(history, 2, 3, mb16).as_deref(),
            Some("000000030000000100000005")
        );
        assert_eq!(
            first_segment_after_switch(history, 2, 3, 64 * 1024 * 1024).as_deref(),
            Some("000000030000000100000001")
        );
        assert_eq!(first_segment_after_switch(history, 4, 5, mb16), None);
        // Two switches in one segment: the file of the later timeline.
        let quick = "1\t0/3000148\tx\n2\t0/3000200\tx\n3\t0/9000000\tx\n";
        assert_eq!(
            first_segment_after_switch(quick, 1, 4, mb16).as_deref(),
            Some("000000030000000000000003")
        );
        assert_eq!(
            first_segment_after_switch(quick, 2, 4, mb16).as_deref(),
            Some("000000030000000000000003")
        );
        assert_eq!(first_segment_after_switch(history, 1, 3, 0), None);
    }

    #[test]
    fn a_history_shows_whether_a_replica_forked() {
        let history = "1\t0/3000148\tno recovery target specified\n\n2\t0/5000000\tno recovery target specified\n";
        assert_eq!(forked(history, 1, 0x300_0148), None);
        assert_eq!(forked(history, 1, 0x300_0000), None);
        assert_eq!(
            forked(history, 1, 0x300_0200).as_deref(),
            Some("it replayed timeline 1 up to 0/3000200, past the switch at 0/3000148")
        );
        assert_eq!(forked(history, 2, 0x500_0000), None);
        assert_eq!(
            forked(history, 4, 0x100).as_deref(),
            Some("timeline 4 is not in its history")
        );
    }

    #[test]
    fn history_file_names() {
        assert_eq!(history_timeline("00000002.history"), Some(2));
        assert_eq!(history_timeline("0000000A.history"), Some(10));
        assert_eq!(history_timeline("000000010000000000000001"), None);
        assert_eq!(history_timeline("2.history"), None);
    }
}
