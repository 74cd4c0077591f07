//! libFuzzer's driver of the `query` target (`src/query.rs` says what it checks).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mpg_gateway_fuzz::query::run(data));
