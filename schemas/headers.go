package schemas

// Header keys carried by every data record.
const (
	// HeaderOperation is OpUpsert or OpDelete.
	HeaderOperation = "operation"
	// HeaderUpdatedAt is the row's updated_at in TimeLayout.
	HeaderUpdatedAt = "updated_at"
	// HeaderConnector is the connector name.
	HeaderConnector = "connector"
)

// Operation header values.
const (
	OpUpsert = "upsert"
	OpDelete = "delete"
)
