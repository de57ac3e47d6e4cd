module herald/sdks/go

go 1.19
