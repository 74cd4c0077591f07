//! libFuzzer's driver of the `http1_request_head` target (`src/http1_request_head.rs` says what it checks).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mpg_gateway_fuzz::http1_request_head::run(data));
