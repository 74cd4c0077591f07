use super::*;

const BUSY: Duration = Duration::from_secs(10);

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    json: Value,
}

/// One request to `svc` at `now`, for organization `org` ("" for none).
async fn call(
    svc: &DemoClusters,
    method: Method,
    path: &str,
    org: &str,
    body: &str,
    now: Instant,
) -> Answer {
    let mut headers = HeaderMap::new();
    if !org.is_empty() {
        headers.insert("x-mpg-organization-id", HeaderValue::from_str(org).unwrap());
    }
    let res = svc.answer(&method, path, &headers, &Bytes::from(body.to_string()), now);
    let (head, body) = res.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    let json = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).unwrap()
    };
    Answer {
        status: head.status,
        headers: head.headers,
        json,
    }
}

#[tokio::test]
async fn a_cluster_lives_through_create_get_update_and_delete() {
    let svc = DemoClusters::seeded("acme", BUSY);
    let t0 = Instant::now();
    let created = call(
        &svc,
        Method::POST,
        COLLECTION,
        "acme",
        r#"{"name":"reports","plan":"medium"}"#,
        t0,
    )
    .await;
    assert_eq!(created.status, 201, "{}", created.json);
    let id = created.json["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("cl_"), "{id}");
    assert_eq!(created.json["status"], "provisioning");
    assert_eq!(created.json["engine"], "postgres-16");
    assert_eq!(created.json["plan"], "medium");
    assert_eq!(created.json["organization_id"], "acme");
    assert_eq!(created.headers[LOCATION], format!("{COLLECTION}/{id}"));
    let one = format!("{COLLECTION}/{id}");

    // The list holds the seeded clusters and the new one, for acme only.
    let list = call(&svc, Method::GET, COLLECTION, "acme", "", t0).await;
    assert_eq!(list.status, 200);
    let ids: Vec<&str> = list.json["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["cl_demo_primary", "cl_demo_analytics", id.as_str()]);
    let other = call(&svc, Method::GET, COLLECTION, "other", "", t0).await;
    assert_eq!(other.json, json!({ "data": [] }));
    let hidden = call(&svc, Method::GET, &one, "other", "", t0).await;
    assert_eq!(hidden.status, 404);
    assert_eq!(hidden.json["error"], "NotFound");

    // While it is provisioning, a change is a 409 saying when to retry
    // (whole seconds, rounded up).
    let later = t0 + Duration::from_millis(1500);
    let busy = call(
        &svc,
        Method::PATCH,
        &one,
        "acme",
        r#"{"plan":"large"}"#,
        later,
    )
    .await;
    assert_eq!(busy.status, 409, "{}", busy.json);
    assert_eq!(busy.headers[RETRY_AFTER], "9");
    assert_eq!(busy.json["error"], "Conflict");
    assert!(
        busy.json["message"]
            .as_str()
            .unwrap()
            .contains("provisioning"),
        "{}",
        busy.json
    );
    let busy = call(
        &svc,
        Method::DELETE,
        &one,
        "acme",
        "",
        t0 + BUSY - Duration::from_millis(1),
    )
    .await;
    assert_eq!(busy.status, 409);
    assert_eq!(busy.headers[RETRY_AFTER], "1");

    // Once running, it can change; then it is "updating" for a while.
    let t1 = t0 + BUSY;
    let got = call(&svc, Method::GET, &one, "acme", "", t1).await;
    assert_eq!(
        (got.status, &got.json["status"]),
        (StatusCode::OK, &json!("running"))
    );
    let updated = call(
        &svc,
        Method::PATCH,
        &one,
        "acme",
        r#"{"name":"reports-2","plan":"large"}"#,
        t1,
    )
    .await;
    assert_eq!(updated.status, 200, "{}", updated.json);
    assert_eq!(updated.json["status"], "updating");
    assert_eq!(updated.json["name"], "reports-2");
    assert_eq!(updated.json["plan"], "large");
    let busy = call(&svc, Method::DELETE, &one, "acme", "", t1).await;
    assert_eq!(busy.status, 409);
    assert!(busy.json["message"].as_str().unwrap().contains("updating"));
    assert_eq!(busy.headers[RETRY_AFTER], "10");

    // Another organization cannot delete it; its own can, once settled.
    let t2 = t1 + BUSY;
    let foreign = call(&svc, Method::DELETE, &one, "other", "", t2).await;
    assert_eq!(foreign.status, 404);
    let deleted = call(&svc, Method::DELETE, &one, "acme", "", t2).await;
    assert_eq!(
        (deleted.status, deleted.json.clone()),
        (StatusCode::NO_CONTENT, Value::Null)
    );
    let gone = call(&svc, Method::GET, &one, "acme", "", t2).await;
    assert_eq!(gone.status, 404);
}

#[tokio::test]
async fn bad_input_is_a_400_naming_the_field() {
    let svc = DemoClusters::seeded("acme", BUSY);
    let now = Instant::now();
    let one = format!("{COLLECTION}/cl_demo_primary");
    let secret_field = format!(r#"{{"name":"x","mpg_{}":1}}"#, "A".repeat(38));
    for (method, path, body, field) in [
        (Method::POST, COLLECTION, "{", "body"),
        (Method::POST, COLLECTION, "[]", "body"),
        (Method::POST, COLLECTION, "{}", "name"),
        (Method::POST, COLLECTION, r#"{"name":"Reports!"}"#, "name"),
        (Method::POST, COLLECTION, r#"{"name":"-x"}"#, "name"),
        (Method::POST, COLLECTION, r#"{"name":"x-"}"#, "name"),
        (
            Method::POST,
            COLLECTION,
            &format!(r#"{{"name":"{}"}}"#, "a".repeat(64)),
            "name",
        ),
        (Method::POST, COLLECTION, r#"{"name":7}"#, "name"),
        (
            Method::POST,
            COLLECTION,
            r#"{"name":"x","engine":"mysql-8"}"#,
            "engine",
        ),
        (Method::POST, COLLECTION, r#"{"name":"x","plan":3}"#, "plan"),
        (
            Method::POST,
            COLLECTION,
            r#"{"name":"x","size":"xl"}"#,
            "size",
        ),
        (Method::POST, COLLECTION, &secret_field, "body"),
        (Method::PATCH, &one, "{}", "body"),
        (Method::PATCH, &one, r#"{"engine":"postgres-17"}"#, "engine"),
        (Method::PATCH, &one, r#"{"plan":"huge"}"#, "plan"),
    ] {
        let res = call(&svc, method.clone(), path, "acme", body, now).await;
        assert_eq!(res.status, 400, "{method} {body}: {}", res.json);
        assert_eq!(res.json["error"], "BadRequest");
        assert_eq!(res.json["details"]["field"], field, "{body}");
        let message = res.json["message"].as_str().unwrap();
        assert!(message.starts_with(&format!("{field}: ")), "{message}");
        assert!(!message.contains("AAAAAAAA"), "{message}");
    }
    // Nothing was created or changed.
    let list = call(&svc, Method::GET, COLLECTION, "acme", "", now).await;
    assert_eq!(list.json["data"].as_array().unwrap().len(), 2);
    assert_eq!(list.json["data"][0]["status"], "running");
    // The organization is the gateway's to send.
    let res = call(&svc, Method::GET, COLLECTION, "", "", now).await;
    assert_eq!(res.status, 400);
    assert_eq!(res.json["details"]["field"], "organization_id");
}

#[tokio::test]
async fn unknown_paths_and_methods_are_refused() {
    let svc = DemoClusters::seeded("acme", BUSY);
    let now = Instant::now();
    for path in [
        "/api/v1/other",
        "/api/v1/clustersx",
        "/api/v1/clusters/",
        "/api/v1/clusters/a/b",
    ] {
        let res = call(&svc, Method::GET, path, "acme", "", now).await;
        assert_eq!(res.status, 404, "{path}");
    }
    let res = call(&svc, Method::PUT, COLLECTION, "acme", "", now).await;
    assert_eq!(res.status, 405);
    assert_eq!(res.headers["allow"], "GET, HEAD, POST");
    let res = call(
        &svc,
        Method::POST,
        "/api/v1/clusters/cl_demo_primary",
        "acme",
        "",
        now,
    )
    .await;
    assert_eq!(res.status, 405);
    assert_eq!(res.headers["allow"], "GET, HEAD, PATCH, DELETE");
}
