//! libFuzzer's driver of the `config` target (`src/config.rs` says what it checks).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mpg_gateway_fuzz::config::run(data));
