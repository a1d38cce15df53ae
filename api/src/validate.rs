//! Semantic checks the CRD schema cannot express. Controllers run them first
//! and report a failure as `Ready=False, reason=InvalidSpec` with the message,
//! without retrying until the spec changes.

use std::net::{Ipv4Addr, Ipv6Addr};

use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};

use crate::backup::v1::BackupScheduleSpec;
use crate::cloud::v1alpha1::{DnsRecordSpec, ObjectBucketSpec, RecordType};
use crate::database::v1::DatabaseClusterSpec;

/// One problem with a spec; the message names the field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum InvalidSpec {
    #[error("spec.resources: the {resource} request {request} exceeds its limit {limit}")]
    RequestAboveLimit {
        resource: String,
        request: String,
        limit: String,
    },
    #[error("spec.resources: {resource} quantity {value:?} is not a valid quantity")]
    BadQuantity { resource: String, value: String },
    #[error(
        "spec.replication.synchronousReplicas ({synchronous}) must be below spec.instances \
         ({instances}): commits would wait for replicas that do not exist"
    )]
    TooFewReplicas { synchronous: i32, instances: i32 },
    #[error("spec.schedule: {0}")]
    BadSchedule(String),
    #[error("spec.timeZone: {0:?} is not a time zone of the IANA database")]
    UnknownTimeZone(String),
    #[error("spec.bucketName: {name:?} {problem}")]
    BadBucketName { name: String, problem: &'static str },
    #[error("spec.values[{index}]: {value:?} is not a valid {record_type:?} value: {expected}")]
    BadRecordValue {
        index: usize,
        value: String,
        record_type: RecordType,
        expected: &'static str,
    },
}

/// Requests must not exceed limits (the API server would reject the pods), and
/// the synchronous replicas must exist (the schema has the same rule; this
/// holds whatever path changed `instances`, the scale subresource included).
pub fn database_cluster(spec: &DatabaseClusterSpec) -> Vec<InvalidSpec> {
    let mut problems = Vec::new();
    if let Some(replication) = &spec.replication
        && replication.synchronous_replicas >= spec.instances
    {
        problems.push(InvalidSpec::TooFewReplicas {
            synchronous: replication.synchronous_replicas,
            instances: spec.instances,
        });
    }
    let Some(resources) = &spec.resources else {
        return problems;
    };
    let (Some(requests), Some(limits)) = (&resources.requests, &resources.limits) else {
        return problems;
    };
    for (resource, request) in requests {
        let Some(limit) = limits.get(resource) else {
            continue;
        };
        match (parse_quantity(&request.0), parse_quantity(&limit.0)) {
            (Some(r), Some(l)) if r > l => problems.push(InvalidSpec::RequestAboveLimit {
                resource: resource.clone(),
                request: request.0.clone(),
                limit: limit.0.clone(),
            }),
            (None, _) => problems.push(InvalidSpec::BadQuantity {
                resource: resource.clone(),
                value: request.0.clone(),
            }),
            (_, None) => problems.push(InvalidSpec::BadQuantity {
                resource: resource.clone(),
                value: limit.0.clone(),
            }),
            _ => {}
        }
    }
    problems
}

/// The schedule must be a valid 5-field cron expression and the time zone
/// one the IANA database knows.
pub fn backup_schedule(spec: &BackupScheduleSpec) -> Vec<InvalidSpec> {
    let mut problems = Vec::new();
    if let Err(e) = parse_schedule(&spec.schedule) {
        problems.push(InvalidSpec::BadSchedule(e));
    }
    if let Some(zone) = &spec.time_zone
        && zone.parse::<chrono_tz::Tz>().is_err()
    {
        problems.push(InvalidSpec::UnknownTimeZone(zone.clone()));
    }
    problems
}

/// Parses a 5-field cron expression (minute hour day-of-month month
/// day-of-week), as schedules use it.
pub fn parse_schedule(schedule: &str) -> Result<Cron, String> {
    if schedule.split_whitespace().count() != 5 {
        return Err(format!(
            "{schedule:?} must have 5 fields: minute hour day-of-month month day-of-week"
        ));
    }
    CronParser::builder()
        .seconds(Seconds::Disallowed)
        .year(Year::Disallowed)
        .build()
        .parse(schedule)
        .map_err(|e| format!("{schedule:?} is not a valid cron expression: {e}"))
}

/// S3's bucket naming rules beyond the schema's pattern.
pub fn object_bucket(spec: &ObjectBucketSpec) -> Vec<InvalidSpec> {
    let Some(name) = &spec.bucket_name else {
        return Vec::new();
    };
    let problem = if name.parse::<Ipv4Addr>().is_ok() {
        Some("must not be formatted as an IP address")
    } else if name.contains("..") || name.contains(".-") || name.contains("-.") {
        Some("must not contain two adjacent periods or a period next to a hyphen")
    } else if name.starts_with("xn--") || name.starts_with("sthree-") {
        Some("must not start with xn-- or sthree- (reserved by S3)")
    } else if name.ends_with("-s3alias") || name.ends_with("--ol-s3") {
        Some("must not end with -s3alias or --ol-s3 (reserved by S3)")
    } else {
        None
    };
    problem
        .map(|problem| InvalidSpec::BadBucketName {
            name: name.clone(),
            problem,
        })
        .into_iter()
        .collect()
}

/// Each value must fit the record type.
pub fn dns_record(spec: &DnsRecordSpec) -> Vec<InvalidSpec> {
    let check: fn(&str) -> bool = match spec.type_ {
        RecordType::A => |v| v.parse::<Ipv4Addr>().is_ok(),
        RecordType::AAAA => |v| v.parse::<Ipv6Addr>().is_ok(),
        RecordType::CNAME | RecordType::NS => is_dns_name,
        RecordType::MX => |v| {
            matches!(v.split_whitespace().collect::<Vec<_>>()[..],
            [priority, host] if priority.parse::<u16>().is_ok() && is_dns_name(host))
        },
        RecordType::SRV => |v| {
            matches!(v.split_whitespace().collect::<Vec<_>>()[..],
            [p, w, port, host] if [p, w, port].iter().all(|n| n.parse::<u16>().is_ok()) && is_dns_name(host))
        },
        RecordType::TXT | RecordType::CAA => |v| !v.is_empty() && v.len() <= 4000,
    };
    let expected = match spec.type_ {
        RecordType::A => "an IPv4 address",
        RecordType::AAAA => "an IPv6 address",
        RecordType::CNAME | RecordType::NS => "a DNS name",
        RecordType::MX => "\"<priority> <host>\"",
        RecordType::SRV => "\"<priority> <weight> <port> <host>\"",
        RecordType::TXT | RecordType::CAA => "1 to 4000 characters",
    };
    spec.values
        .iter()
        .enumerate()
        .filter(|(_, value)| !check(value))
        .map(|(index, value)| InvalidSpec::BadRecordValue {
            index,
            value: value.clone(),
            record_type: spec.type_,
            expected,
        })
        .collect()
}

fn is_dns_name(name: &str) -> bool {
    let name = name.strip_suffix('.').unwrap_or(name);
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        })
}

/// The value of a Kubernetes quantity ("500m", "1Gi", "1e3", "0.7") in
/// billionths, exactly: `700m` and `0.7` are equal, as Kubernetes says.
/// Values finer than a billionth round up, as Kubernetes rounds them.
pub fn parse_quantity(quantity: &str) -> Option<i128> {
    let split = quantity
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(quantity.len());
    let (number, suffix) = quantity.split_at(split);
    let (negative, number) = match number.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, number.strip_prefix('+').unwrap_or(number)),
    };
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    let all_digits = |s: &str| s.chars().all(|c| c.is_ascii_digit());
    if (whole.is_empty() && fraction.is_empty()) || !all_digits(whole) || !all_digits(fraction) {
        return None;
    }
    let digits = format!("{whole}{fraction}");
    if digits.len() > 30 {
        return None;
    }
    let digits: i128 = digits.parse().ok()?;
    let (binary, exponent): (i128, i32) = match suffix {
        "" => (1, 0),
        "n" => (1, -9),
        "u" => (1, -6),
        "m" => (1, -3),
        "k" => (1, 3),
        "M" => (1, 6),
        "G" => (1, 9),
        "T" => (1, 12),
        "P" => (1, 15),
        "E" => (1, 18),
        "Ki" => (1 << 10, 0),
        "Mi" => (1 << 20, 0),
        "Gi" => (1 << 30, 0),
        "Ti" => (1 << 40, 0),
        "Pi" => (1 << 50, 0),
        "Ei" => (1 << 60, 0),
        other => (1, other.strip_prefix(['e', 'E'])?.parse().ok()?),
    };
    // billionths = digits * binary * 10^(exponent + 9 - fraction digits)
    let scale = exponent + 9 - i32::try_from(fraction.len()).ok()?;
    let value = digits.checked_mul(binary)?;
    let value = if scale >= 0 {
        value.checked_mul(10i128.checked_pow(scale.unsigned_abs())?)?
    } else {
        let divisor = 10i128.checked_pow(scale.unsigned_abs())?;
        (value + divisor - 1) / divisor
    };
    Some(if negative { -value } else { value })
}

/// A quantity in the form the API server stores it ("0.5" → "500m",
/// "1024Mi" → "1Gi", "1000" → "1k"), so a controller that compares what it
/// wants with what the server holds sees no change where there is none.
/// Follows `resource.Quantity`'s canonical form: the suffix family the user
/// chose (binary, decimal, exponent) is kept, a binary value that is not a
/// whole number of units or is under 1024 falls back to decimal.
pub fn canonical_quantity(quantity: &str) -> Option<String> {
    const NANOS: i128 = 1_000_000_000;
    let value = parse_quantity(quantity)?;
    if value == 0 {
        return Some("0".to_owned());
    }
    let suffix = quantity.trim_start_matches(|c: char| c.is_ascii_digit() || ".+-".contains(c));
    let binary = suffix.ends_with('i');
    let exponent_form = suffix.len() > 1 && suffix.starts_with(['e', 'E']);
    if binary && value.abs() >= 1024 * NANOS && value % NANOS == 0 {
        let (mut units, mut power) = (value / NANOS, 0);
        while units % 1024 == 0 && power < 6 {
            units /= 1024;
            power += 1;
        }
        let suffix = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"][power];
        return Some(format!("{units}{suffix}"));
    }
    // mantissa × 10^exponent, trailing zeros moved into the exponent, then
    // the exponent lowered to a multiple of three.
    let (mut mantissa, mut exponent) = (value, -9i32);
    while mantissa % 10 == 0 {
        mantissa /= 10;
        exponent += 1;
    }
    match exponent.rem_euclid(3) {
        1 => (mantissa, exponent) = (mantissa * 10, exponent - 1),
        2 => (mantissa, exponent) = (mantissa * 100, exponent - 2),
        _ => {}
    }
    let suffix = match (exponent_form, exponent) {
        (_, 0) => String::new(),
        (true, e) => format!("e{e}"),
        (false, -9) => "n".into(),
        (false, -6) => "u".into(),
        (false, -3) => "m".into(),
        (false, 3) => "k".into(),
        (false, 6) => "M".into(),
        (false, 9) => "G".into(),
        (false, 12) => "T".into(),
        (false, 15) => "P".into(),
        (false, 18) => "E".into(),
        (false, e) => format!("e{e}"),
    };
    Some(format!("{mantissa}{suffix}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn from<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> T {
        serde_json::from_value(value).expect("valid test spec")
    }

    #[test]
    fn quantities_take_the_form_the_api_server_stores() {
        for (written, stored) in [
            ("0.5", "500m"),
            ("500m", "500m"),
            ("1", "1"),
            ("1000", "1k"),
            ("1500", "1500"),
            ("2000m", "2"),
            ("1.5", "1500m"),
            ("1024Mi", "1Gi"),
            ("1Gi", "1Gi"),
            ("1536Mi", "1536Mi"),
            ("1.5Gi", "1536Mi"),
            ("0.5Ki", "512"),
            ("1000Ki", "1000Ki"),
            ("100M", "100M"),
            ("1G", "1G"),
            ("1e3", "1e3"),
            ("1e2", "100"),
            ("0", "0"),
            ("0Gi", "0"),
            ("0.1n", "1n"),
        ] {
            assert_eq!(
                canonical_quantity(written).as_deref(),
                Some(stored),
                "{written}"
            );
        }
        assert_eq!(canonical_quantity("lots"), None);
    }

    #[test]
    fn quantities_parse_exactly_in_every_notation() {
        const ONE: i128 = 1_000_000_000;
        assert_eq!(parse_quantity("500m"), Some(ONE / 2));
        assert_eq!(parse_quantity("2"), Some(2 * ONE));
        assert_eq!(parse_quantity("1Gi"), Some(1_073_741_824 * ONE));
        assert_eq!(parse_quantity("1G"), Some(ONE * ONE));
        assert_eq!(parse_quantity("1e3"), Some(1000 * ONE));
        assert_eq!(parse_quantity("1.5Ki"), Some(1536 * ONE));
        assert_eq!(parse_quantity("700m"), parse_quantity("0.7"));
        assert_eq!(parse_quantity("2300m"), parse_quantity("2.3"));
        assert_eq!(parse_quantity("1024Mi"), parse_quantity("1Gi"));
        assert_eq!(parse_quantity("1n"), Some(1));
        assert_eq!(parse_quantity("0.1n"), Some(1), "rounds up");
        for bad in ["ten", "1Qi", "", ".", "1.2.3", "--1"] {
            assert_eq!(parse_quantity(bad), None, "{bad}");
        }
    }

    fn cluster(resources: serde_json::Value) -> DatabaseClusterSpec {
        from(json!({
            "instances": 1, "postgres": {"version": "17"}, "storage": {"size": "1Gi"},
            "resources": resources
        }))
    }

    #[test]
    fn a_request_above_its_limit_is_invalid() {
        let spec = cluster(
            json!({"requests": {"memory": "2Gi", "cpu": "1"}, "limits": {"memory": "1Gi", "cpu": "2"}}),
        );
        let problems = database_cluster(&spec);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(
            problems[0].to_string(),
            "spec.resources: the memory request 2Gi exceeds its limit 1Gi"
        );
        let fine = cluster(
            json!({"requests": {"memory": "1024Mi", "cpu": "700m"}, "limits": {"memory": "1Gi", "cpu": "0.7"}}),
        );
        assert!(database_cluster(&fine).is_empty());
    }

    #[test]
    fn synchronous_replicas_must_be_fewer_than_the_instances() {
        let spec = |instances: i32| -> DatabaseClusterSpec {
            from(json!({
                "instances": instances, "postgres": {"version": "17"}, "storage": {"size": "1Gi"},
                "replication": {"synchronousReplicas": 2}
            }))
        };
        assert!(database_cluster(&spec(3)).is_empty());
        let problems = database_cluster(&spec(2));
        assert_eq!(
            problems.iter().map(ToString::to_string).collect::<Vec<_>>(),
            [
                "spec.replication.synchronousReplicas (2) must be below spec.instances (2): \
              commits would wait for replicas that do not exist"
            ]
        );
    }

    fn schedule(schedule: &str, zone: Option<&str>) -> BackupScheduleSpec {
        from(json!({
            "schedule": schedule, "timeZone": zone,
            "template": {"spec": {"cluster": {"name": "c"}, "method": "logical",
                "destination": {"bucketRef": {"name": "b"}}}}
        }))
    }

    #[test]
    fn schedules_need_five_valid_fields_and_a_known_zone() {
        assert!(backup_schedule(&schedule("0 3 * * *", Some("Europe/Paris"))).is_empty());
        assert!(backup_schedule(&schedule("*/15 0-6 1,15 * MON-FRI", None)).is_empty());
        for bad in [
            "61 3 * * *",
            "0 25 * * *",
            "0 3 32 * *",
            "0 3 * 13 *",
            "0 0 3 * * *",
            "@hourly",
        ] {
            let problems = backup_schedule(&schedule(bad, None));
            assert!(
                matches!(problems[..], [InvalidSpec::BadSchedule(_)]),
                "{bad}: {problems:?}"
            );
        }
        let problems = backup_schedule(&schedule("0 3 * * *", Some("Europe/Atlantis")));
        assert_eq!(
            problems,
            vec![InvalidSpec::UnknownTimeZone("Europe/Atlantis".into())]
        );
    }

    fn bucket(name: &str) -> ObjectBucketSpec {
        from(json!({"providerConfigRef": {"name": "p"}, "bucketName": name}))
    }

    #[test]
    fn bucket_names_follow_s3_rules() {
        assert!(object_bucket(&bucket("acme-backups.eu")).is_empty());
        for bad in [
            "192.168.1.10",
            "acme..backups",
            "acme.-backups",
            "xn--acme",
            "acme-s3alias",
        ] {
            assert_eq!(object_bucket(&bucket(bad)).len(), 1, "{bad}");
        }
    }

    fn record(type_: &str, values: &[&str]) -> DnsRecordSpec {
        from(
            json!({"providerConfigRef": {"name": "p"}, "zone": "example.com",
            "name": "x.example.com", "type": type_, "values": values}),
        )
    }

    #[test]
    fn record_values_fit_their_type() {
        assert!(dns_record(&record("A", &["10.0.0.1", "192.0.2.7"])).is_empty());
        assert!(dns_record(&record("AAAA", &["2001:db8::1"])).is_empty());
        assert!(dns_record(&record("CNAME", &["orders-rw.db.svc.cluster.local."])).is_empty());
        assert!(dns_record(&record("MX", &["10 mail.example.com"])).is_empty());
        let problems = dns_record(&record("A", &["10.0.0.1", "2001:db8::1", "host"]));
        let indexes: Vec<_> = problems
            .iter()
            .map(|p| match p {
                InvalidSpec::BadRecordValue { index, .. } => *index,
                other => panic!("unexpected {other:?}"),
            })
            .collect();
        assert_eq!(indexes, vec![1, 2]);
        assert_eq!(dns_record(&record("MX", &["mail.example.com"])).len(), 1);
        assert_eq!(
            dns_record(&record("CNAME", &["-bad-.example.com"])).len(),
            1
        );
    }
}
