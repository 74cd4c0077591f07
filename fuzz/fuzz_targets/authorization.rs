//! libFuzzer's driver of the `authorization` target (`src/authorization.rs` says what it checks).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mpg_gateway_fuzz::authorization::run(data));
