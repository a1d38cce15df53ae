//! End-to-end suites against the local control plane live in `tests/`; each
//! file is one suite (`cargo test -p cairn-e2e --test <suite>`).
