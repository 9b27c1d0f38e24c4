//! The stand-in in a process of its own (`reactifact-model-stand-in`): it prints its address,
//! answers with the last user message, and another process reads its count.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use reactifact_model::{ChatClient, ChatRequest};

/// Kills the child when the test ends, passed or not.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn the_stand_in_program_prints_its_address_and_counts_requests_for_other_processes() {
    let mut child = Killed(
        Command::new(env!("CARGO_BIN_EXE_reactifact-model-stand-in"))
            .args(["--listen", "127.0.0.1:0"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut line = String::new();
    BufReader::new(child.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let base_url = line
        .trim()
        .strip_prefix("stand-in model listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_owned();
    assert!(
        base_url.starts_with("http://127.0.0.1:") && base_url.ends_with("/v1"),
        "{base_url}"
    );

    let client = ChatClient::new(&base_url, None).unwrap();
    let request = ChatRequest::new("any").system("Repeat.").user("hello there");
    for _ in 0..2 {
        let answer = client.complete(&request).await.unwrap();
        assert_eq!(answer.text(), "hello there");
        assert_eq!((answer.usage.prompt_tokens, answer.usage.completion_tokens), (3, 2));
    }
    let count = reqwest::get(base_url.replace("/v1", "/requests"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(count, r#"{"requests":2}"#);
}
