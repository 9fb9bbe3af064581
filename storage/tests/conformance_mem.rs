//! The storage conformance suite on the mem backend.

concord_storage::storage_conformance_tests!(concord_storage::BackendKind::Memory);
