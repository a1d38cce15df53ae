//! What may let this instance take writes, in one place for the supervisor:
//! the heartbeat (its Lease renewals), the peers (the other members'
//! acknowledgements, and the claims this one hears), and the fence that
//! stops postgres when neither allows it.

use std::sync::Arc;

use crate::children::{Children, Signaller};
use crate::fence::Fence;
use crate::membership::Heartbeat;
use crate::peers::Peers;

#[derive(Clone)]
pub struct Primacy {
    pub heartbeat: Arc<Heartbeat>,
    pub peers: Option<Arc<Peers>>,
    fence: Arc<Fence>,
}

impl Primacy {
    /// Starts the fence for `heartbeat`, with its watchdog a child of
    /// `children` when given.
    pub fn new(
        heartbeat: Arc<Heartbeat>,
        peers: Option<Arc<Peers>>,
        children: Option<&Children>,
    ) -> Self {
        Self {
            fence: Fence::start(heartbeat.clone(), children),
            heartbeat,
            peers,
        }
    }

    /// Outside a pod: nothing forbids a primary, nothing is claimed.
    pub fn none() -> Self {
        Self::new(Heartbeat::none(), None, None)
    }

    /// Why this instance must not take writes now, if it must not.
    pub fn forbids_primary(&self) -> Option<String> {
        self.heartbeat.forbids_primary()
    }

    /// Why this instance must not become a primary now: another member
    /// claimed to be a writable primary within the hold time.
    pub fn forbids_promotion(&self) -> Option<String> {
        let claimer = self.peers.as_ref()?.holding_for()?;
        Some(format!(
            "not promoting: {claimer} claimed to be a writable primary within {} s",
            crate::peers::HOLD.as_secs()
        ))
    }

    /// postgres (`postmaster`) is about to take writes: claim to the other
    /// members, and arm the fence.
    pub fn serving(&self, postmaster: Signaller) {
        if let Some(peers) = &self.peers {
            peers.start_claiming();
        }
        self.fence.arm(postmaster);
    }

    /// postgres stopped, or restarts as a replica: no more claims, and the
    /// members hear that this one stepped down.
    pub async fn stopped(&self) {
        self.fence.disarm();
        if let Some(peers) = &self.peers {
            peers.step_down().await;
        }
    }
}
