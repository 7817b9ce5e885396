//! Sessions that belong to a client: another client's calls cannot reach them, by full id or by
//! prefix, and when their client is gone they are stopped. Against the real Docker engine.

mod common;

use common::*;
use python_code_sandbox::engine::sessions::{ClientId, Scope};
use python_code_sandbox::engine::{EngineError, RunOptions, Task};

fn is_unknown(result: Result<impl std::fmt::Debug, EngineError>) -> bool {
    matches!(result, Err(EngineError::UnknownSession(_)))
}

#[tokio::test]
async fn a_client_reaches_only_its_own_sessions() {
    if skip_without_engine() {
        return;
    }
    no_hang(async {
        let engine = engine_with(|c| c.pool_size = 0);
        let (alice, bob) = (ClientId::new(), ClientId::new());
        let options = RunOptions::default();
        let a = engine
            .create_session(Scope::Client(&alice), &options)
            .await
            .expect("alice's session");
        let b = engine
            .create_session(Scope::Client(&bob), &options)
            .await
            .expect("bob's session");
        engine
            .execute_in_session(
                Scope::Client(&alice),
                &a,
                Task::Python("secret = 1"),
                &options,
            )
            .await
            .expect("alice runs in hers");

        for id in [a.as_str(), &a[..12]] {
            let bob_scope = Scope::Client(&bob);
            assert!(is_unknown(
                engine
                    .execute_in_session(bob_scope, id, Task::Python("print(secret)"), &options)
                    .await
            ));
            assert!(is_unknown(
                engine.write_file(bob_scope, id, "x.txt", b"bob").await
            ));
            assert!(is_unknown(engine.read_file(bob_scope, id, "x.txt").await));
            assert!(is_unknown(engine.list_files(bob_scope, id, "").await));
            assert!(is_unknown(engine.stop_session(bob_scope, id).await));
        }
        let ids = |scope| {
            engine
                .sessions(scope)
                .into_iter()
                .map(|s| s.id)
                .collect::<Vec<_>>()
        };
        assert_eq!(ids(Scope::Client(&alice)), vec![a.clone()]);
        assert_eq!(ids(Scope::Client(&bob)), vec![b.clone()]);
        let mut all = ids(Scope::Server);
        all.sort();
        let mut expected = vec![a.clone(), b.clone()];
        expected.sort();
        assert_eq!(all, expected, "the whole server sees both");

        // Alice's session is untouched, and the server scope reaches it too.
        let shown = in_session(&engine, &a, "print(secret)").await;
        assert_eq!(text(&shown.stdout), "1\n");

        // Bob leaves: his session is stopped, Alice's stays.
        assert_eq!(engine.end_client(&bob), 1);
        assert_eq!(engine.end_client(&bob), 0);
        engine.settle().await;
        let (containers, _) =
            labelled("io.python-code-sandbox.instance", &engine.owner().instance).await;
        assert!(!containers.contains(&b), "bob's sandbox outlived him");
        assert!(containers.contains(&a));
        let gone = engine
            .execute_in_session(Scope::Client(&bob), &b, Task::Python("1"), &options)
            .await;
        assert!(
            matches!(gone, Err(EngineError::SessionEnded { .. })),
            "{gone:?}"
        );
        assert!(
            is_unknown(
                engine
                    .execute_in_session(Scope::Client(&alice), &b, Task::Python("1"), &options)
                    .await
            ),
            "another client does not even learn that it ended"
        );

        engine.shutdown().await;
        assert_nothing_left(&engine).await;
    })
    .await;
}
