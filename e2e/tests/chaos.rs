//! The chaos run: a fixed list of seeds, a few minutes each (see
//! `e2e/src/chaos/` for what it does and checks). Other seeds and longer
//! runs: `hack/chaos.sh [--seed N] [--minutes M]`, which runs this test with
//! `CAIRN_CHAOS_SEEDS` and `CAIRN_CHAOS_MINUTES`. See docs/chaos.md.

use cairn_e2e::chaos::{self, Settings};

/// The suite's seeds.
const SEEDS: [u64; 2] = [1, 2];
/// One minute each: in the test command, the chaos run proves the invariants
/// hold through every kind of action (about 20 a seed); long runs, which
/// find the rare interleavings, are `hack/chaos.sh --minutes 10` and more.
const MINUTES: f64 = 1.0;

#[tokio::test]
async fn every_invariant_holds_under_chaos() -> chaos::Result {
    let settings = Settings::from_env(&SEEDS, MINUTES)?;
    let tally = chaos::run(&settings).await?;
    chaos::assert_held(&tally)
}
