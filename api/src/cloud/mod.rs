//! The `cloud.cairn.dev` group: `ProviderConfig`, `ObjectBucket`, `DnsRecord`.

pub mod v1alpha1;
