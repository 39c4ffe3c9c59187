#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = bitmend_fuzz::tier::tier_image(data);
});
