//! libFuzzer's driver of the `http1_chunked` target (`src/http1_chunked.rs` says what it checks).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mpg_gateway_fuzz::http1_chunked::run(data));
