//! DnsRecord → a Route53 record set. Route53 has no tags on record sets, so
//! ownership is a TXT record beside it (`_cairn-owner-<type>.<name>`,
//! holding `cairn.dev/owner-uid=<uid>`), written in the same change batch as
//! the record: Route53 applies a batch all or nothing, so a record Cairn
//! creates is never without its owner, even when the response is lost.

use aws_sdk_route53::Client;
use aws_sdk_route53::types::{
    Change, ChangeAction, ChangeBatch, ResourceRecord, ResourceRecordSet, RrType,
};
use cairn_api::cloud::v1alpha1::{CloudStatus, DnsRecord, DnsRecordSpec, RecordType};
use std::collections::BTreeMap;

use crate::driver::Managed;
use crate::external::{CloudError, External, OWNER_TAG, Observation, fail};
use crate::policy::Observed;
use crate::provider::Provider;

/// The record set as Route53 holds it, as far as the spec is concerned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordSet {
    pub ttl: Option<i64>,
    pub values: Vec<String>,
}

fn type_name(type_: RecordType) -> &'static str {
    match type_ {
        RecordType::A => "A",
        RecordType::AAAA => "AAAA",
        RecordType::CNAME => "CNAME",
        RecordType::TXT => "TXT",
        RecordType::MX => "MX",
        RecordType::SRV => "SRV",
        RecordType::CAA => "CAA",
        RecordType::NS => "NS",
    }
}

/// The external name of a record: its name and type, e.g.
/// `db.example.com/CNAME`.
pub fn record_id(spec: &DnsRecordSpec) -> String {
    format!("{}/{}", spec.name, type_name(spec.type_))
}

/// The name of the TXT record that says who owns `spec`'s record (a
/// wildcard's owner cannot start with `*`).
pub fn owner_record_name(spec: &DnsRecordSpec) -> String {
    let type_ = type_name(spec.type_).to_ascii_lowercase();
    match spec.name.strip_prefix("*.") {
        Some(rest) => format!("_cairn-owner-{type_}-wildcard.{rest}"),
        None => format!("_cairn-owner-{type_}.{}", spec.name),
    }
}

fn owner_value(owner: &str) -> String {
    format!("\"{OWNER_TAG}={owner}\"")
}

fn owner_of(value: &str) -> Option<String> {
    value
        .trim_matches('"')
        .strip_prefix(&format!("{OWNER_TAG}="))
        .map(str::to_owned)
}

/// A value as Route53 holds it: TXT values are quoted strings.
fn stored_value(type_: RecordType, value: &str) -> String {
    if type_ == RecordType::TXT && !value.starts_with('"') {
        format!("\"{}\"", value.replace('"', "\\\""))
    } else {
        value.to_owned()
    }
}

/// Route53 answers with absolute names (a trailing dot) and `*` escaped.
fn same_name(answered: &str, name: &str) -> bool {
    answered.trim_end_matches('.').replace("\\052", "*") == name
}

/// What differs from the spec (empty: up to date).
pub fn drift(spec: &DnsRecordSpec, actual: &RecordSet) -> Vec<String> {
    let mut drift = Vec::new();
    if actual.ttl != Some(spec.ttl) {
        drift.push(format!("ttl {:?} (want {})", actual.ttl, spec.ttl));
    }
    let mut wanted: Vec<String> = spec
        .values
        .iter()
        .map(|v| stored_value(spec.type_, v))
        .collect();
    wanted.sort();
    let mut values = actual.values.clone();
    values.sort();
    if values != wanted {
        drift.push(format!("values {values:?} (want {wanted:?})"));
    }
    drift
}

/// Route53 through one client of a ProviderConfig, for one object's record
/// (a deletion needs the zone and type, which the name does not carry).
pub struct Records {
    pub route53: Client,
    pub spec: DnsRecordSpec,
}

impl Records {
    /// The id of the hosted zone for domain `zone`.
    async fn zone_id(&self, zone: &str) -> Result<String, CloudError> {
        let answer = self
            .route53
            .list_hosted_zones_by_name()
            .dns_name(zone)
            .max_items(1)
            .send()
            .await
            .map_err(|e| fail("ListHostedZonesByName", e))?;
        answer
            .hosted_zones()
            .iter()
            .find(|z| same_name(z.name(), zone))
            .map(|z| z.id().to_owned())
            .ok_or_else(|| CloudError::Invalid {
                operation: "ListHostedZonesByName",
                code: "NoSuchHostedZone".to_owned(),
                message: format!("no hosted zone {zone} (spec.zone)"),
            })
    }

    /// The record set `name`/`type_` in zone `zone_id`, if there is one.
    async fn find(
        &self,
        zone_id: &str,
        name: &str,
        type_: &str,
    ) -> Result<Option<RecordSet>, CloudError> {
        let answer = self
            .route53
            .list_resource_record_sets()
            .hosted_zone_id(zone_id)
            .start_record_name(name)
            .start_record_type(RrType::from(type_))
            .max_items(1)
            .send()
            .await
            .map_err(|e| fail("ListResourceRecordSets", e))?;
        Ok(answer
            .resource_record_sets()
            .iter()
            .find(|set| same_name(set.name(), name) && set.r#type().as_str() == type_)
            .map(|set| RecordSet {
                ttl: set.ttl(),
                values: set
                    .resource_records()
                    .iter()
                    .map(|r| r.value().to_owned())
                    .collect(),
            }))
    }

    async fn change(&self, zone_id: &str, changes: Vec<Change>) -> Result<(), CloudError> {
        let batch = ChangeBatch::builder()
            .set_changes(Some(changes))
            .build()
            .map_err(built("ChangeResourceRecordSets"))?;
        self.route53
            .change_resource_record_sets()
            .hosted_zone_id(zone_id)
            .change_batch(batch)
            .send()
            .await
            .map(drop)
            .map_err(|e| fail("ChangeResourceRecordSets", e))
            .map_err(|e| match e {
                // Made meanwhile by someone else: the next observation says
                // whose it is.
                CloudError::Invalid { message, .. } if message.contains("already exists") => {
                    CloudError::Unavailable {
                        operation: "ChangeResourceRecordSets",
                        message,
                    }
                }
                other => other,
            })
    }
}

fn built(operation: &'static str) -> impl Fn(aws_sdk_route53::error::BuildError) -> CloudError {
    move |e| CloudError::Invalid {
        operation,
        code: "BuildError".to_owned(),
        message: e.to_string(),
    }
}

/// One change of record set `name`/`type_`.
fn change(
    action: ChangeAction,
    name: &str,
    type_: &str,
    ttl: i64,
    values: &[String],
) -> Result<Change, CloudError> {
    let records = values
        .iter()
        .map(|v| ResourceRecord::builder().value(v).build())
        .collect::<Result<Vec<_>, _>>()
        .map_err(built("ChangeResourceRecordSets"))?;
    let set = ResourceRecordSet::builder()
        .name(name)
        .r#type(RrType::from(type_))
        .ttl(ttl)
        .set_resource_records(Some(records))
        .build()
        .map_err(built("ChangeResourceRecordSets"))?;
    Change::builder()
        .action(action)
        .resource_record_set(set)
        .build()
        .map_err(built("ChangeResourceRecordSets"))
}

/// The record as the spec asks, and its owner record.
fn wanted(
    action: ChangeAction,
    spec: &DnsRecordSpec,
    owner: &str,
) -> Result<Vec<Change>, CloudError> {
    let values: Vec<String> = spec
        .values
        .iter()
        .map(|v| stored_value(spec.type_, v))
        .collect();
    Ok(vec![
        change(action, &spec.name, type_name(spec.type_), spec.ttl, &values)?,
        change(
            ChangeAction::Upsert,
            &owner_record_name(spec),
            "TXT",
            spec.ttl,
            &[owner_value(owner)],
        )?,
    ])
}

impl External for Records {
    type Spec = DnsRecordSpec;

    async fn observe(
        &self,
        spec: &DnsRecordSpec,
        _name: &str,
        _owner: &str,
    ) -> Result<Observation, CloudError> {
        let zone_id = self.zone_id(&spec.zone).await?;
        let Some(record) = self
            .find(&zone_id, &spec.name, type_name(spec.type_))
            .await?
        else {
            return Ok(Observation::absent());
        };
        let owner = self
            .find(&zone_id, &owner_record_name(spec), "TXT")
            .await?
            .and_then(|set| set.values.iter().find_map(|v| owner_of(v)));
        let drift = drift(spec, &record);
        Ok(Observation {
            observed: Observed::Present {
                owner,
                created: None,
                up_to_date: drift.is_empty(),
            },
            at_provider: BTreeMap::from([
                ("zoneId".to_owned(), zone_id),
                ("values".to_owned(), record.values.join(",")),
            ]),
            drift,
        })
    }

    async fn create(
        &self,
        spec: &DnsRecordSpec,
        _name: &str,
        owner: &str,
    ) -> Result<(), CloudError> {
        let zone_id = self.zone_id(&spec.zone).await?;
        // CREATE, not UPSERT: a record made meanwhile is never overwritten.
        self.change(&zone_id, wanted(ChangeAction::Create, spec, owner)?)
            .await
    }

    async fn update(
        &self,
        spec: &DnsRecordSpec,
        _name: &str,
        owner: &str,
    ) -> Result<(), CloudError> {
        let zone_id = self.zone_id(&spec.zone).await?;
        self.change(&zone_id, wanted(ChangeAction::Upsert, spec, owner)?)
            .await
    }

    async fn delete(&self, _name: &str) -> Result<(), CloudError> {
        let spec = &self.spec;
        let zone_id = self.zone_id(&spec.zone).await?;
        let (name, type_) = (spec.name.as_str(), type_name(spec.type_));
        let owner_name = owner_record_name(spec);
        let mut changes = Vec::new();
        // A DELETE must name the set exactly as Route53 holds it.
        for (name, type_) in [(name, type_), (owner_name.as_str(), "TXT")] {
            if let Some(set) = self.find(&zone_id, name, type_).await? {
                let ttl = set.ttl.unwrap_or(spec.ttl);
                changes.push(change(ChangeAction::Delete, name, type_, ttl, &set.values)?);
            }
        }
        if changes.is_empty() {
            return Ok(());
        }
        self.change(&zone_id, changes).await
    }
}

impl Managed for DnsRecord {
    type External = Records;

    fn desired(&self) -> &DnsRecordSpec {
        &self.spec
    }

    fn derived_name(&self) -> String {
        record_id(&self.spec)
    }

    fn cloud_status(&self) -> Option<&CloudStatus> {
        self.status.as_ref()
    }

    fn external(&self, provider: &Provider) -> Records {
        Records {
            route53: provider.route53(),
            spec: self.spec.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_api::cloud::v1alpha1::{DeletionPolicy, ManagementPolicy};
    use cairn_api::common::LocalObjectReference;

    fn spec(name: &str, type_: RecordType, values: &[&str]) -> DnsRecordSpec {
        DnsRecordSpec {
            provider_config_ref: LocalObjectReference { name: "aws".into() },
            zone: "example.com".into(),
            name: name.into(),
            type_,
            ttl: 300,
            values: values.iter().map(|v| (*v).to_owned()).collect(),
            deletion_policy: DeletionPolicy::Delete,
            management_policy: ManagementPolicy::Manage,
        }
    }

    #[test]
    fn owner_records_are_per_name_and_type_and_never_wildcards() {
        assert_eq!(
            owner_record_name(&spec("db.example.com", RecordType::A, &[])),
            "_cairn-owner-a.db.example.com"
        );
        assert_eq!(
            owner_record_name(&spec("db.example.com", RecordType::AAAA, &[])),
            "_cairn-owner-aaaa.db.example.com"
        );
        assert_eq!(
            owner_record_name(&spec("*.apps.example.com", RecordType::CNAME, &[])),
            "_cairn-owner-cname-wildcard.apps.example.com"
        );
        assert_eq!(owner_of(&owner_value("uid-1")).as_deref(), Some("uid-1"));
        assert_eq!(owner_of("\"v=spf1 -all\""), None);
    }

    #[test]
    fn drift_ignores_order_and_txt_quoting() {
        let a = spec("db.example.com", RecordType::A, &["10.0.0.2", "10.0.0.1"]);
        let held = RecordSet {
            ttl: Some(300),
            values: vec!["10.0.0.1".into(), "10.0.0.2".into()],
        };
        assert!(drift(&a, &held).is_empty());
        let txt = spec("db.example.com", RecordType::TXT, &["hello"]);
        let quoted = RecordSet {
            ttl: Some(300),
            values: vec!["\"hello\"".into()],
        };
        assert!(drift(&txt, &quoted).is_empty());
        let changed = RecordSet {
            ttl: Some(60),
            values: vec!["10.0.0.9".into()],
        };
        assert_eq!(drift(&a, &changed).len(), 2);
    }

    #[test]
    fn answered_names_are_absolute_with_escaped_wildcards() {
        assert!(same_name("db.example.com.", "db.example.com"));
        assert!(same_name("\\052.apps.example.com.", "*.apps.example.com"));
        assert!(!same_name("db2.example.com.", "db.example.com"));
    }
}
