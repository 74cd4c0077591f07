//! libFuzzer's driver of the `http1_response` target (`src/http1_response.rs` says what it checks).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mpg_gateway_fuzz::http1_response::run(data));
