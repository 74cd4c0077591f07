//! libFuzzer's driver of the `jwks` target (`src/jwks.rs` says what it checks).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mpg_gateway_fuzz::jwks::run(data));
