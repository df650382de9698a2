//! Helpers of the unit tests.

/// A fresh, empty directory of the test's own (under `target/e2e-scratch`), named after `name`,
/// this process and a counter; removed when dropped unless the test failed.
pub(crate) fn scratch(name: &str) -> Scratch {
    Scratch::new(name)
}

pub(crate) use e2e_tests::Scratch;
