//! A primary's peers: what keeps it serving while it cannot reach the API
//! server, and what keeps a replica that still hears it from promoting.
//!
//! While its postgres runs as a primary and may take writes, an instance
//! sends a claim to every other member each `CLAIM_PERIOD` (UDP, each message
//! signed with a key only the members hold). A member assigned a replica
//! acknowledges each claim; every member that receives one holds: it refuses
//! to be promoted until `HOLD` after the last claim it received, unless the
//! claimer says it stepped down (its postgres stopped). The primary may take
//! writes past its heartbeat's fence only while every member acknowledged a
//! claim it sent within `ACK_WINDOW` (`Heartbeat::forbids_primary`).
//!
//! No two primaries: a replica acknowledges only while assigned a replica,
//! so its last acknowledgement answers a claim sent before it received the
//! last claim; the primary's peer-kept writes end `ACK_WINDOW` after that
//! send, plus the fence's reaction (`fence::CHECK`), and the replica
//! promotes no sooner than `HOLD` after that receipt, which is longer. Both
//! durations are measured on each side's own monotonic clock: no wall clock
//! is compared. The full argument: docs/database-controller.md.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use tokio::net::UdpSocket;

/// How often a primary claims.
pub const CLAIM_PERIOD: Duration = Duration::from_millis(500);
/// How recent the claim a member acknowledged must be (by its send) for the
/// primary to keep taking writes without a heartbeat.
pub const ACK_WINDOW: Duration = Duration::from_secs(2);
/// How long after the last claim it received a member refuses promotion:
/// longer than `ACK_WINDOW` plus the fence's reaction, with a margin for the
/// scheduling of both processes.
pub const HOLD: Duration = Duration::from_secs(4);
/// A member's address is looked up again after this long; the last one
/// found is kept while DNS does not answer.
const ADDRESS_TTL: Duration = Duration::from_secs(10);
/// Claims whose acknowledgement is still awaited.
const SENT_KEPT: usize = 32;
const PROTOCOL: &str = "cairn-peer/1";

/// This member's side of the protocol; cheap to share.
pub struct Peers {
    me: String,
    cluster: String,
    members_file: PathBuf,
    key_file: PathBuf,
    address_of: Box<dyn Fn(&str) -> String + Send + Sync>,
    socket: UdpSocket,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// While this member claims: its current run of claims.
    claims: Option<Claims>,
    /// The claims heard from other members, by pod.
    heard: HashMap<String, Heard>,
    /// Members' addresses, with when each was looked up.
    addresses: HashMap<String, (SocketAddr, Instant)>,
}

struct Claims {
    /// A new random number each time this member starts claiming: a
    /// step-down names the run it ends, so a replayed one ends no other.
    run: u64,
    next: u64,
    sent: VecDeque<(u64, Instant)>,
    /// Per member: when the latest claim it acknowledged was sent.
    acknowledged: HashMap<String, Instant>,
    /// The members each acknowledging member knows of, as its latest
    /// acknowledgement lists them: a member added to the cluster while this
    /// one's members list is not yet updated must acknowledge too.
    named: HashMap<String, Vec<String>>,
}

#[derive(Clone, Copy)]
struct Heard {
    run: u64,
    at: Instant,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Claim,
    Ack,
    Down,
}

impl Kind {
    fn word(self) -> &'static str {
        match self {
            Kind::Claim => "claim",
            Kind::Ack => "ack",
            Kind::Down => "down",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Message {
    kind: Kind,
    cluster: String,
    from: String,
    to: String,
    run: u64,
    seq: u64,
    /// An acknowledgement: the members its sender knows of.
    members: Vec<String>,
}

impl Message {
    fn encode(&self, key: &[u8]) -> Vec<u8> {
        let members = match self.members.is_empty() {
            true => "-".to_owned(),
            false => self.members.join(","),
        };
        let body = format!(
            "{PROTOCOL} {} {} {} {} {} {} {members}",
            self.kind.word(),
            self.cluster,
            self.from,
            self.to,
            self.run,
            self.seq
        );
        let mac = signer(key).map(|mut m| {
            m.update(body.as_bytes());
            m.finalize().into_bytes()
        });
        let hex: String = mac
            .iter()
            .flatten()
            .map(|byte| format!("{byte:02x}"))
            .collect();
        format!("{body} {hex}").into_bytes()
    }

    /// The message, if it is well formed and signed with `key`.
    fn decode(bytes: &[u8], key: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(bytes).ok()?;
        let (body, hex) = text.rsplit_once(' ')?;
        let signature: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
            .collect::<Option<_>>()?;
        let mut mac = signer(key)?;
        mac.update(body.as_bytes());
        mac.verify_slice(&signature).ok()?;
        let fields: Vec<&str> = body.split(' ').collect();
        let [protocol, kind, cluster, from, to, run, seq, members] = fields.as_slice() else {
            return None;
        };
        if *protocol != PROTOCOL {
            return None;
        }
        let kind = match *kind {
            "claim" => Kind::Claim,
            "ack" => Kind::Ack,
            "down" => Kind::Down,
            _ => return None,
        };
        Some(Self {
            kind,
            cluster: (*cluster).to_owned(),
            from: (*from).to_owned(),
            to: (*to).to_owned(),
            run: run.parse().ok()?,
            seq: seq.parse().ok()?,
            members: match *members {
                "-" => Vec::new(),
                list => list.split(',').map(str::to_owned).collect(),
            },
        })
    }
}

fn signer(key: &[u8]) -> Option<Hmac<Sha256>> {
    Hmac::<Sha256>::new_from_slice(key).ok()
}

impl Peers {
    /// `me` of `cluster`, on `socket`; the members are listed one per line
    /// in `members_file`, the key is the content of `key_file`, and a
    /// member's address is `address_of(pod)` (`host:port`).
    pub fn new(
        me: String,
        cluster: String,
        members_file: PathBuf,
        key_file: PathBuf,
        address_of: impl Fn(&str) -> String + Send + Sync + 'static,
        socket: UdpSocket,
    ) -> Arc<Self> {
        Arc::new(Self {
            me,
            cluster,
            members_file,
            key_file,
            address_of: Box::new(address_of),
            socket,
            inner: Mutex::default(),
        })
    }

    /// Claims while `may_claim` says so and this member claims at all,
    /// answers the other members, and keeps `hears_primary` in `state`.
    pub async fn run(
        self: Arc<Self>,
        may_claim: impl Fn() -> bool,
        assigned_replica: impl Fn() -> bool,
        state: Arc<crate::state::State>,
    ) {
        let mut ticks = tokio::time::interval(CLAIM_PERIOD);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut buffer = vec![0_u8; 4096];
        loop {
            tokio::select! {
                _ = ticks.tick() => {
                    if may_claim() {
                        self.claim().await;
                    }
                    let holding = self.holding_for();
                    if state.status().hears_primary != holding {
                        state.update(|s| s.hears_primary = holding);
                    }
                }
                received = self.socket.recv_from(&mut buffer) => {
                    if let Ok((length, sender)) = received {
                        self.receive(&buffer[..length], sender, assigned_replica()).await;
                    }
                }
            }
        }
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts a run of claims (postgres is about to run as a primary).
    pub fn start_claiming(&self) {
        let mut inner = self.inner();
        if inner.claims.is_none() {
            inner.claims = Some(Claims {
                run: rand::random(),
                next: 0,
                sent: VecDeque::new(),
                acknowledged: HashMap::new(),
                named: HashMap::new(),
            });
        }
    }

    /// Whether this member is claiming.
    pub fn claiming(&self) -> bool {
        self.inner().claims.is_some()
    }

    /// Ends the run of claims once postgres stopped taking writes, and tells
    /// the members so: they need not hold any longer.
    pub async fn step_down(&self) {
        let Some(run) = self.inner().claims.take().map(|c| c.run) else {
            return;
        };
        tracing::info!("stepped down: telling the other members");
        // Best effort, three times: a lost one only makes them hold `HOLD`.
        for _ in 0..3 {
            self.send_all(Kind::Down, run, 0).await;
        }
    }

    /// Ok with how many members acknowledged a claim sent within `window`,
    /// if every other member did; else why not.
    pub fn all_acknowledged_within(&self, window: Duration) -> Result<usize, String> {
        let required = self.others();
        let inner = self.inner();
        let Some(claims) = &inner.claims else {
            return Err("it claims no primary role to its peers".to_owned());
        };
        if required.is_empty() {
            return Err("no other member can confirm that it still reaches them".to_owned());
        }
        let missing: Vec<&str> = required
            .iter()
            .filter(|m| {
                claims
                    .acknowledged
                    .get(*m)
                    .is_none_or(|sent| sent.elapsed() > window)
            })
            .map(String::as_str)
            .collect();
        match missing.is_empty() {
            true => Ok(required.len()),
            false => Err(format!(
                "{} acknowledged no claim within {} s",
                missing.join(", "),
                window.as_secs()
            )),
        }
    }

    /// How much longer the acknowledgements now held keep writes allowed
    /// (each member's latest one ages out `window` after its claim was
    /// sent); None when they do not allow them now.
    pub fn acknowledged_for(&self, window: Duration) -> Option<Duration> {
        self.all_acknowledged_within(window).ok()?;
        let required = self.others();
        let inner = self.inner();
        let claims = inner.claims.as_ref()?;
        required
            .iter()
            .map(|m| window.checked_sub(claims.acknowledged.get(m)?.elapsed()))
            .collect::<Option<Vec<_>>>()?
            .into_iter()
            .min()
    }

    /// Every member but this one: the members file's, and those the
    /// acknowledgements of the current claims name.
    fn others(&self) -> BTreeSet<String> {
        let mut others: BTreeSet<String> = self.members().into_iter().collect();
        if let Some(claims) = &self.inner().claims {
            others.extend(claims.named.values().flatten().cloned());
        }
        others.remove(&self.me);
        others
    }

    /// The member whose claim to be a writable primary this one heard
    /// within `HOLD`, if any: it must not be promoted meanwhile.
    pub fn holding_for(&self) -> Option<String> {
        self.inner()
            .heard
            .iter()
            .filter(|(_, heard)| heard.at.elapsed() < HOLD)
            .max_by_key(|(_, heard)| heard.at)
            .map(|(pod, _)| pod.clone())
    }

    fn members(&self) -> Vec<String> {
        crate::files::members(&self.members_file).unwrap_or_default()
    }

    fn key(&self) -> Vec<u8> {
        std::fs::read(&self.key_file).unwrap_or_default()
    }

    /// Sends the next claim to every other member, if claiming.
    pub async fn claim(&self) {
        let (run, seq) = {
            let mut inner = self.inner();
            let Some(claims) = inner.claims.as_mut() else {
                return;
            };
            let seq = claims.next;
            claims.next += 1;
            claims.sent.push_back((seq, Instant::now()));
            while claims.sent.len() > SENT_KEPT {
                claims.sent.pop_front();
            }
            (claims.run, seq)
        };
        self.send_all(Kind::Claim, run, seq).await;
    }

    async fn send_all(&self, kind: Kind, run: u64, seq: u64) {
        let key = self.key();
        for member in self.others() {
            let message = Message {
                kind,
                cluster: self.cluster.clone(),
                from: self.me.clone(),
                to: member.clone(),
                run,
                seq,
                members: Vec::new(),
            };
            if let Some(address) = self.address(&member).await {
                let _ = self.socket.send_to(&message.encode(&key), address).await;
            }
        }
    }

    async fn address(&self, member: &str) -> Option<SocketAddr> {
        let known = self.inner().addresses.get(member).copied();
        if let Some((address, at)) = known
            && at.elapsed() < ADDRESS_TTL
        {
            return Some(address);
        }
        let host = (self.address_of)(member);
        let found = tokio::time::timeout(Duration::from_secs(1), tokio::net::lookup_host(host))
            .await
            .ok()
            .and_then(Result::ok)
            .and_then(|mut addresses| addresses.next());
        match found {
            Some(address) => {
                self.inner()
                    .addresses
                    .insert(member.to_owned(), (address, Instant::now()));
                Some(address)
            }
            None => known.map(|(address, _)| address),
        }
    }

    /// Handles one datagram from `sender`; `replica`: whether this member is
    /// assigned a replica (only then does it acknowledge claims).
    async fn receive(&self, bytes: &[u8], sender: SocketAddr, replica: bool) {
        let key = self.key();
        let Some(message) = Message::decode(bytes, &key) else {
            return;
        };
        if message.cluster != self.cluster || message.to != self.me || message.from == self.me {
            return;
        }
        match message.kind {
            Kind::Claim => {
                self.inner().heard.insert(
                    message.from.clone(),
                    Heard {
                        run: message.run,
                        at: Instant::now(),
                    },
                );
                if replica {
                    let ack = Message {
                        kind: Kind::Ack,
                        from: self.me.clone(),
                        to: message.from,
                        members: self.members(),
                        ..message
                    };
                    let _ = self.socket.send_to(&ack.encode(&key), sender).await;
                }
            }
            Kind::Down => {
                let mut inner = self.inner();
                if inner
                    .heard
                    .get(&message.from)
                    .is_some_and(|h| h.run == message.run)
                {
                    tracing::info!(member = %message.from, "the member claiming the primary role stepped down");
                    inner.heard.remove(&message.from);
                }
            }
            Kind::Ack => {
                let mut inner = self.inner();
                let Some(claims) = inner.claims.as_mut().filter(|c| c.run == message.run) else {
                    return;
                };
                let Some(sent) = claims
                    .sent
                    .iter()
                    .find(|(seq, _)| *seq == message.seq)
                    .map(|(_, at)| *at)
                else {
                    return;
                };
                let latest = claims
                    .acknowledged
                    .entry(message.from.clone())
                    .or_insert(sent);
                *latest = (*latest).max(sent);
                claims.named.insert(message.from.clone(), message.members);
            }
        }
    }
}

#[cfg(test)]
mod tests;
