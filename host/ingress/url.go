package ingress

import "net/url"

func urlOf(path string) *url.URL { return &url.URL{Path: path} }
