//! What the node's HTTP tests share: an open node keeping its data in a directory, served on
//! 127.0.0.1, and a client for it.

use std::path::Path;
use std::sync::Arc;

use tenet_net::{NodeClient, identity};
use tenet_node::{Node, NodeConfig};

/// An open node (any key may call it) keeping its data in `data`.
pub fn open_node(data: &Path) -> Arc<Node> {
    let config = NodeConfig {
        open: true,
        listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: data.to_path_buf(),
        ..NodeConfig::default()
    };
    Node::start(config).unwrap()
}

/// Serve `node` on a free port of 127.0.0.1 until the runtime ends, and a client for it signing
/// as a fresh key.
pub async fn serve(node: Arc<Node>) -> NodeClient {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(tenet_node::http::serve(
        node,
        listener,
        std::future::pending(),
    ));
    NodeClient::new(&url, identity::generate()).unwrap()
}
