package producer

// ClassifyRecover exposes classifyRecover to the tests.
var ClassifyRecover = classifyRecover
