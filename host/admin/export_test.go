package admin

// Sample takes a sample of the host's metrics now, as the sampling
// goroutine does every Options.SampleEvery.
func Sample(s *Server) { s.rates.take() }
