//! libFuzzer's driver of the `admin_api` target (`src/admin_api.rs` says what it checks).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mpg_gateway_fuzz::admin_api::run(data));
