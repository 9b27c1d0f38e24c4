//! Compile-time behaviour of the macros: every mistake in `ui/fail` must fail with the reviewed
//! message in its `.stderr`; everything in `ui/pass` must compile and run.

#[test]
fn ui() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("ui/fail/*.rs");
    cases.pass("ui/pass/*.rs");
}
