//! libFuzzer's driver of the `proxy_header` target (`src/proxy_header.rs` says what it checks).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mpg_gateway_fuzz::proxy_header::run(data));
